"""Fast-dLLM v2's decoder (NVlabs Fast-dLLM v2, the modeling file's ``generate`` and the
generation utilities' ``batch_sample``): threshold decoding one sub-block at a time.

A block is cut into sub-blocks of ``sub_block`` positions, decoded left to right. At each step,
of the first sub-block that still holds a mask, every masked position whose confidence is
strictly above ``threshold`` is committed, and always the most confident one. A block whose first
position is generated (every block but the one holding the end of the prompt) begins with an
autoregressive step: that position alone is committed, predicted from the last position of the
block before it (the token shift; the official loop takes the argmax of the completed block's
last logit, its "next token", before decoding the new block).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from caidllm.decode.policies.base import PolicySettings, StepView, with_most_confident
from caidllm.errors import InputError
from caidllm.setting_rules import (
    UNIT_INTERVAL,
    CacheSettings,
    Rule,
    chosen_by,
    named,
    positive_int,
    unit_interval,
)


@dataclasses.dataclass
class SubblockSettings(PolicySettings):
    """The threshold, and the sub-block length, which must divide the block."""

    threshold: float = 0.9
    sub_block: int = 8

    OWNER: ClassVar[str] = "subblock"
    TITLE: ClassVar[str] = "Fast-dLLM v2's sub-block decoding"
    LEGACY: ClassVar[dict[str, str]] = {"threshold": "threshold", "sub_block": "sub_block"}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("threshold", UNIT_INTERVAL, unit_interval),
        Rule("sub_block", "a positive integer", positive_int),
    )

    def check_with(self, config) -> None:
        if config.block_length % self.sub_block:
            name, field = named(config.labels, "subblock.sub_block")
            raise InputError(
                f"{name} ({self.sub_block}) must divide block_length ({config.block_length}): "
                "Fast-dLLM v2 decodes a block in whole sub-blocks",
                field=field,
            )

    def arguments(self, gating: bool) -> dict:
        return dict(threshold=self.threshold, sub_block=self.sub_block)


@dataclasses.dataclass
class WithinBlockCacheSettings(CacheSettings):
    """Cache "subblock", Fast-dLLM v2's within-block cache: no settings, but it follows this policy's
    sub-blocks."""

    def check_with(self, config) -> None:
        if config.policy != "subblock":
            raise InputError(
                f"cache 'subblock' with policy {config.policy!r} is not meaningful: Fast-dLLM v2's "
                "within-block cache follows its sub-blocks (use policy 'subblock', or cache 'block')",
                field=chosen_by(config, "cache"),
            )


def current_sub_block(masked: torch.Tensor, sub_block: int) -> torch.Tensor:
    """[R, block] True at the positions of each row's first sub-block that holds a mask."""
    index = torch.arange(masked.shape[1], device=masked.device) // sub_block
    beyond = masked.shape[1] // sub_block  # above every sub-block index: rows without a mask match none
    current = torch.where(masked, index, beyond).min(dim=1, keepdim=True).values
    return index == current


def select(view: StepView, threshold: float, sub_block: int) -> torch.Tensor:
    eligible = view.masked & current_sub_block(view.masked, sub_block)
    commit = with_most_confident(
        eligible & (view.confidence > threshold), dataclasses.replace(view, masked=eligible)
    )
    first_only = torch.zeros_like(commit)
    first_only[:, 0] = True
    return torch.where(view.masked[:, :1], first_only, commit)
