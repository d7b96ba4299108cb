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

if TYPE_CHECKING:
    from caidllm.decode.config import DecodeConfig
    from caidllm.decode.request import Request


def _no_key(config: "DecodeConfig") -> tuple:
    return ()


def _no_inputs(members: list["Request"], masked: torch.Tensor) -> dict:
    return {}


@dataclass(frozen=True)
class ForwardPlan:
    """What the runner does for one forward mode.

    group_key: beyond the mode and the block length, rows share one forward only when these values
        of their configs are equal.
    inputs: the extra keyword arguments of DiffusionLM.forward for a group of rows (their requests,
        and which positions of their blocks are still masked).
    """

    group_key: Callable[["DecodeConfig"], tuple] = _no_key
    inputs: Callable[[list["Request"], torch.Tensor], dict] = _no_inputs

    def computed_pairs(self, inputs: dict, n_layers: int, block_length: int) -> int:
        """(layer, block position) pairs the forward computed for each row."""
        skip = inputs.get("skip")
        return n_layers * block_length if skip is None else skip.computed_pairs


def _early_skip_key(config: "DecodeConfig") -> tuple:
    return (config.es_schedule, config.es_alpha)


def _early_skip_inputs(members: list["Request"], masked: torch.Tensor) -> dict:
    config = members[0].config
    return {"skip": EarlySkip(torch.stack([r.prev_confidence for r in members]),
                              torch.stack([r.just_committed for r in members]), masked,
                              config.es_schedule, config.es_alpha)}


FORWARD_PLANS: dict[ForwardMode, ForwardPlan] = {
    ForwardMode.FULL: ForwardPlan(),
    ForwardMode.PREFIX: ForwardPlan(),
    ForwardMode.DUAL: ForwardPlan(),
    ForwardMode.ES: ForwardPlan(group_key=_early_skip_key, inputs=_early_skip_inputs),
}


@dataclass(frozen=True)
class CacheMode:
    """A value of DecodeConfig.cache: the forward a request runs between refreshes (a refresh is
    always a full forward), and whether it skips early (its next forward then reads this step's
    confidences and commits, and its cache keeps hidden states)."""

    between_refreshes: ForwardMode
    early_skipping: bool = False

    @property
    def uses_cache(self) -> bool:
        return self.between_refreshes != ForwardMode.FULL


CACHE_MODES: dict[str, CacheMode] = {
    "none": CacheMode(ForwardMode.FULL),
    "prefix": CacheMode(ForwardMode.PREFIX),
    "dual": CacheMode(ForwardMode.DUAL),
    "es": CacheMode(ForwardMode.ES, early_skipping=True),  # the dual cache with ES-dLLM early skipping
}
