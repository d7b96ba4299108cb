"""The cache modes (DecodeConfig.cache), one line each: the forward each runs between refreshes, its
settings dataclass and its engine side (decode/caches/base.py's CacheMode; a mode with per-request
memory or its own forward schedule subclasses it in its own module).

The forward modes themselves, the model's computation and the engine's inputs of each, are one
module each in models/modes/ (one registry, FORWARD_MODES, read by the model and the engine). The
valid `cache` values are read from CACHE_MODES here.
"""

from __future__ import annotations

from caidllm.decode.caches.base import CacheMode
from caidllm.decode.caches.dkv import DKVCache
from caidllm.decode.caches.es import EarlySkippingCache
from caidllm.decode.caches.exact import ExactCache
from caidllm.decode.caches.prompt import PromptCache
from caidllm.decode.elastic import ElasticCache, ElasticSettings
from caidllm.decode.policies.subblock import WithinBlockCacheSettings
from caidllm.models.modes import DKV, Block, Dual, EarlySkipping, Elastic, Full, Prefix
from caidllm.models.modes.dkv import GreedySettings
from caidllm.models.skip import EarlySkippingSettings

CACHE_MODES: dict[str, CacheMode] = {
    "none": CacheMode(Full),
    "prefix": CacheMode(Prefix),
    "dual": CacheMode(Dual),
    # the dual cache with ES-dLLM early skipping
    "es": EarlySkippingCache(
        EarlySkipping, settings_type=EarlySkippingSettings, method="ES-dLLM's early skipping"
    ),
    # dKV-Cache-Decode: refreshes at a block's first two steps (at the first, the block's tokens are all
    # masks; at the second, the first step's commits get their K/V) and every f (8 in its preset).
    "dkv": DKVCache(DKV, refreshes_at_start=2, method="dKV-Cache's delayed cache"),
    "dkv-greedy": DKVCache(DKV, greedy=True, settings_type=GreedySettings, method="dKV-Cache-Greedy's cache"),
    # the prompt's K/V cached, the answer computed
    "prompt": PromptCache(DKV, method="dLLM-Cache's prompt cache"),
    "elastic": ElasticCache(
        Elastic,
        refreshes_at_start=0,
        settings_type=ElasticSettings,
        method="Elastic-Cache's drift-refreshed cache",
    ),
    "block": ExactCache(Block),  # block-causal models' exact cache
    # plus Fast-dLLM v2's within-block cache
    "subblock": ExactCache(Block, within_block=True, settings_type=WithinBlockCacheSettings),
}
