"""Which forward mode each cache setting (DecodeConfig.cache) runs between refreshes.

The forward modes themselves, the model's computation and the engine's inputs of each, are one
module each in models/modes/ (one registry, FORWARD_MODES, read by the model and the engine). A
cache setting that uses one between refreshes is one more entry in CACHE_MODES here; the valid
`cache` values are read from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from caidllm.decode.elastic import ElasticSettings
from caidllm.decode.policies.subblock import WithinBlockCacheSettings
from caidllm.models.modes import DKV, Block, Dual, EarlySkipping, Elastic, ForwardMode, Full, Prefix
from caidllm.models.modes.dkv import GreedySettings
from caidllm.models.skip import EarlySkippingSettings
from caidllm.setting_rules import CacheSettings, NoCacheSettings


@dataclass(frozen=True)
class CacheMode:
    """A value of DecodeConfig.cache: the forward a request runs between refreshes (a refresh is
    always a full forward), and whether it skips early (its next forward then reads this step's
    confidences and commits, and its cache keeps hidden states)."""

    between_refreshes: type[ForwardMode]
    early_skipping: bool = False
    # Steps at a block's start that are refreshes (dKV-Cache refreshes at its first two: at the first,
    # the block's tokens are all masks; at the second, the first step's commits get their K/V).
    refreshes_at_start: int = 1
    hidden_every_layer: bool = False  # the cache keeps every layer's input (Elastic-Cache's deep refresh reads it)
    # Exact (block-causal models): never refreshed; a full forward only as the request's first.
    exact: bool = False
    # Fast-dLLM v2's within-block cache: once the block has had a whole forward with its first position
    # known and the current sub-block's first position is decoded, a step computes that sub-block only.
    within_block: bool = False
    settings_type: type[CacheSettings] = NoCacheSettings  # its settings dataclass, declared next to its code

    @property
    def refreshes(self) -> bool:
        """Whether it refreshes on a period (refresh_every): a cache that is not exact."""
        return self.uses_cache and not self.exact

    @property
    def uses_cache(self) -> bool:
        return self.between_refreshes is not Full


CACHE_MODES: dict[str, CacheMode] = {
    "none": CacheMode(Full),
    "prefix": CacheMode(Prefix),
    "dual": CacheMode(Dual),
    "es": CacheMode(EarlySkipping, early_skipping=True, settings_type=EarlySkippingSettings),  # the dual cache with ES-dLLM early skipping
    "dkv": CacheMode(DKV, refreshes_at_start=2),  # dKV-Cache-Decode (refresh every f: 8 in its preset)
    # dKV-Cache-Greedy: only the positions a step decodes, the previous step's and a window of masked
    # neighbours are computed (Request.dkv_columns); its official generate refreshes at steps 0, f, 2f ...
    "dkv-greedy": CacheMode(DKV, settings_type=GreedySettings),
    # Elastic-Cache: every forward is its own (its first computes every column, decode/elastic.py); it
    # refreshes from the layer its drift test names.
    "elastic": CacheMode(Elastic, refreshes_at_start=0, hidden_every_layer=True, settings_type=ElasticSettings),
    "block": CacheMode(Block, exact=True),  # block-causal models' exact cache
    "subblock": CacheMode(Block, exact=True, within_block=True, settings_type=WithinBlockCacheSettings),  # plus Fast-dLLM v2's within-block cache
}
