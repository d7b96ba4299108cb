"""How the engine runs each forward mode, and which mode each cache setting uses.

Adding a forward mode: its name in models/forward_modes.py and its branch in
DiffusionLM.forward (models/lm.py), then one ForwardPlan in FORWARD_PLANS here
(which rows may share it, what its forward needs beyond the canvas and the
cache). A cache setting (DecodeConfig.cache) that uses it between refreshes is
one more entry in CACHE_MODES; the valid `cache` values are read from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from caidllm.models.forward_modes import ForwardMode
from caidllm.models.skip import EarlySkip
from caidllm.models.transfer import to_device

if TYPE_CHECKING:
    from caidllm.decode.config import DecodeConfig
    from caidllm.decode.request import Request


def _no_key(request: "Request") -> tuple:
    return ()


def _no_inputs(members: list["Request"], masked: torch.Tensor, starts: list[int]) -> dict:
    return {}


@dataclass(frozen=True)
class ForwardPlan:
    """What the runner does for one forward mode.

    group_key: beyond the mode and the block length, rows share one forward only when these values
        of their requests (their configs, or where they are) are equal.
    inputs: the extra keyword arguments of DiffusionLM.forward for a group of rows (their requests,
        which positions of their blocks are still masked, and their blocks' first columns).
    """

    group_key: Callable[["Request"], tuple] = _no_key
    inputs: Callable[[list["Request"], torch.Tensor, list[int]], dict] = _no_inputs
    shadow: bool = False  # the forward returns the block's logits, then a verifying shadow block's

    def computed_pairs(self, inputs: dict, n_layers: int, block_length: int) -> int:
        """(layer, block position) pairs the forward computed for each row."""
        skip = inputs.get("skip")
        return n_layers * block_length if skip is None else skip.computed_pairs


def _early_skip_key(request: "Request") -> tuple:
    return (request.config.es_schedule, request.config.es_alpha)


def _early_skip_inputs(members: list["Request"], masked: torch.Tensor, starts: list[int]) -> dict:
    config = members[0].config
    return {"skip": EarlySkip(torch.stack([r.prev_confidence for r in members]),
                              torch.stack([r.just_committed for r in members]), masked,
                              config.es_schedule, config.es_alpha)}


def _dkv_key(request: "Request") -> tuple:
    return (len(request.dkv_columns()),)  # rows computing as many columns share a forward


def _dkv_inputs(members: list["Request"], masked: torch.Tensor, starts: list[int]) -> dict:
    """dKV-Cache-Decode (Ma et al., arXiv 2505.15781; official code horseee/dKV-Cache, LLaDA's
    generate with `cache_reloading_step`): a decoded token's K/V are cached one step after it is
    decoded (at its decoding step its input was still the mask) and reused until the next refresh;
    still-masked positions are computed at every step. So the forward computes each row's
    generated positions that are still masked or were committed at the previous step; the prompt
    and positions decoded two or more steps ago are read from the cache. A block position not
    computed gets the logits of the row's first computed column (it is not masked: no policy
    reads it). The Greedy variant (masked positions cached too, a local window recomputed) is
    not implemented."""
    columns, block_at = [], []
    for r, start in zip(members, starts):
        positions = r.dkv_columns()
        offset = start - r.block_bounds[0]  # the column of generated position 0
        columns.append([offset + p for p in positions])
        where = {p: i for i, p in enumerate(positions)}
        block_start, block_end = r.block_bounds
        block_at.append([where.get(p, 0) for p in range(block_start, block_end)])
    return {"columns": to_device(columns, masked.device), "block_at": to_device(block_at, masked.device)}


FORWARD_PLANS: dict[ForwardMode, ForwardPlan] = {
    ForwardMode.FULL: ForwardPlan(),
    ForwardMode.PREFIX: ForwardPlan(),
    ForwardMode.DUAL: ForwardPlan(),
    ForwardMode.ES: ForwardPlan(group_key=_early_skip_key, inputs=_early_skip_inputs),
    ForwardMode.DKV: ForwardPlan(group_key=_dkv_key, inputs=_dkv_inputs),
    # WINO's verify forward (models/shadow.py): each row alone, with a shadow copy of its block.
    ForwardMode.VERIFY: ForwardPlan(shadow=True),
}


@dataclass(frozen=True)
class CacheMode:
    """A value of DecodeConfig.cache: the forward a request runs between refreshes (a refresh is
    always a full forward), and whether it skips early (its next forward then reads this step's
    confidences and commits, and its cache keeps hidden states)."""

    between_refreshes: ForwardMode
    early_skipping: bool = False
    # Steps at a block's start that are refreshes (dKV-Cache refreshes at its first two: at the first,
    # the block's tokens are all masks; at the second, the first step's commits get their K/V).
    refreshes_at_start: int = 1

    @property
    def uses_cache(self) -> bool:
        return self.between_refreshes != ForwardMode.FULL


CACHE_MODES: dict[str, CacheMode] = {
    "none": CacheMode(ForwardMode.FULL),
    "prefix": CacheMode(ForwardMode.PREFIX),
    "dual": CacheMode(ForwardMode.DUAL),
    "es": CacheMode(ForwardMode.ES, early_skipping=True),  # the dual cache with ES-dLLM early skipping
    "dkv": CacheMode(ForwardMode.DKV, refreshes_at_start=2),  # dKV-Cache-Decode (refresh every f: 8 in its preset)
}
