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

from caidllm.models.elastic import ElasticInputs
from caidllm.models.forward_modes import ForwardMode
from caidllm.models.skip import EarlySkip
from caidllm.models.sub_block import SubBlockInputs
from caidllm.models.transfer import to_device

if TYPE_CHECKING:
    from caidllm.decode.config import DecodeConfig
    from caidllm.decode.request import Request


def _no_key(request: "Request") -> tuple:
    return ()


def _no_inputs(members: list["Request"], masked: torch.Tensor, starts: list[int]) -> dict:
    return {}


def _nothing_after(members: list["Request"], inputs: dict) -> None:
    return None


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
    # What the requests keep from the forward once it ran (Elastic-Cache: its attention profiles).
    after: Callable[[list["Request"], dict], None] = _nothing_after

    def computed_pairs(self, inputs: dict, n_layers: int, block_length: int) -> int:
        """(layer, block position) pairs the forward computed for each row."""
        skip, elastic, sub_block = inputs.get("skip"), inputs.get("elastic"), inputs.get("sub_block")
        if sub_block is not None:
            return n_layers * sub_block.columns.shape[1]
        if elastic is not None:  # the window below the refresh layer, the whole block from it on
            deep = n_layers - elastic.refresh_from
            return (n_layers - deep) * elastic.window.shape[1] + deep * block_length
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
def _fold_inputs(members: list["Request"], masked: torch.Tensor, starts: list[int]) -> dict:
    # The scheduler groups rows by their fold (Request.fold): every member has the same.
    return {"fold": members[0].fold()}


def _elastic_key(request: "Request") -> tuple:
    computed, window = request.elastic_columns()
    return (len(computed), len(window), request.elastic.refresh_from)


def _elastic_inputs(members: list["Request"], masked: torch.Tensor, starts: list[int]) -> dict:
    """Elastic-Cache (decode/elastic.py, models/elastic.py): each row's columns and window as absolute
    columns, the block positions its window predicts, and the layer its refresh starts from."""
    columns, windows, block_at = [], [], []
    for r, start in zip(members, starts):
        computed, window = r.elastic_columns()
        first = start - len(r.prompt) - r.block_bounds[0]  # the row's first real column
        columns.append([first + c for c in computed])
        windows.append([first + c for c in window])
        where = {c - len(r.prompt) - r.block_bounds[0]: i for i, c in enumerate(window)}
        block_at.append([where.get(b, 0) for b in range(r.config.block_length)])
    device = masked.device
    return {"elastic": ElasticInputs(to_device(columns, device), to_device(windows, device),
                                     members[0].elastic.refresh_from, to_device(block_at, device))}


def _elastic_after(members: list["Request"], inputs: dict) -> None:
    for r, profiles in zip(members, inputs["elastic"].profiles):
        r.elastic.observe(profiles, r.config.elastic_gamma, r.config.elastic_layer)


def _sub_block_key(request: "Request") -> tuple:
    return (request.config.sub_block,)


def _sub_block_inputs(members: list["Request"], masked: torch.Tensor, starts: list[int]) -> dict:
    """Fast-dLLM v2's within-block cache: each row's current sub-block as absolute columns, and where
    each block position sits among them."""
    columns, block_at = [], []
    for r, start in zip(members, starts):
        first, size = r.current_sub_block(), r.config.sub_block
        columns.append([start + first + j for j in range(size)])
        block_at.append([b - first if first <= b < first + size else 0 for b in range(r.config.block_length)])
    device = masked.device
    return {"sub_block": SubBlockInputs(to_device(columns, device), to_device(block_at, device))}


FORWARD_PLANS: dict[ForwardMode, ForwardPlan] = {
    ForwardMode.FULL: ForwardPlan(),
    ForwardMode.PREFIX: ForwardPlan(),
    ForwardMode.DUAL: ForwardPlan(),
    ForwardMode.ES: ForwardPlan(group_key=_early_skip_key, inputs=_early_skip_inputs),
    ForwardMode.DKV: ForwardPlan(group_key=_dkv_key, inputs=_dkv_inputs),
    # WINO's verify forward (models/shadow.py): each row alone, with a shadow copy of its block.
    ForwardMode.VERIFY: ForwardPlan(shadow=True),
    ForwardMode.ELASTIC: ForwardPlan(group_key=_elastic_key, inputs=_elastic_inputs, after=_elastic_after),
    # Block diffusion's exact cache (decode/block_diffusion.py): the block, after a completed block the
    # previous one too (its final keys/values written once).
    ForwardMode.BLOCK: ForwardPlan(inputs=_fold_inputs),
    # Fast-dLLM v2's within-block cache (models/sub_block.py): the current sub-block only.
    ForwardMode.SUBBLOCK: ForwardPlan(group_key=_sub_block_key, inputs=_sub_block_inputs),
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
    hidden_every_layer: bool = False  # the cache keeps every layer's input (Elastic-Cache's deep refresh reads it)
    # Exact (block-causal models): never refreshed; a full forward only as the request's first.
    exact: bool = False
    # Fast-dLLM v2's within-block cache: once the block has had a whole forward with its first position
    # known and the current sub-block's first position is decoded, a step computes that sub-block only.
    within_block: bool = False

    @property
    def uses_cache(self) -> bool:
        return self.between_refreshes != ForwardMode.FULL


CACHE_MODES: dict[str, CacheMode] = {
    "none": CacheMode(ForwardMode.FULL),
    "prefix": CacheMode(ForwardMode.PREFIX),
    "dual": CacheMode(ForwardMode.DUAL),
    "es": CacheMode(ForwardMode.ES, early_skipping=True),  # the dual cache with ES-dLLM early skipping
    "dkv": CacheMode(ForwardMode.DKV, refreshes_at_start=2),  # dKV-Cache-Decode (refresh every f: 8 in its preset)
    # dKV-Cache-Greedy: only the positions a step decodes, the previous step's and a window of masked
    # neighbours are computed (Request.dkv_columns); its official generate refreshes at steps 0, f, 2f ...
    "dkv-greedy": CacheMode(ForwardMode.DKV),
    # Elastic-Cache: a full refresh at a block's start, then refreshes from the layer its drift test names.
    "elastic": CacheMode(ForwardMode.ELASTIC, hidden_every_layer=True),
    "block": CacheMode(ForwardMode.BLOCK, exact=True),  # block-causal models' exact cache
    "subblock": CacheMode(ForwardMode.BLOCK, exact=True, within_block=True),  # plus Fast-dLLM v2's within-block cache
}
