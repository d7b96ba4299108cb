"""Fast-dLLM parallel decoding.

Threshold rule: commit every masked token whose confidence >= threshold, and
always the single most confident one. Factor rule: commit the top n tokens
while the n-th highest confidence is >= 1 - factor / (n + 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.checks import is_number
from caidllm.decode.policies.base import (
    PolicySettings,
    StepView,
    masked_confidence,
    rank_by_confidence,
    with_most_confident,
)
from caidllm.setting_rules import UNIT_INTERVAL, Rule, unit_interval


@dataclass
class ThresholdSettings(PolicySettings):
    """Fast-dLLM's commit rule: the confidence threshold, or the factor rule instead (factor set)."""

    threshold: float = 0.9
    factor: float | None = None

    OWNER: ClassVar[str] = "fastdllm"
    TITLE: ClassVar[str] = "Fast-dLLM parallel decoding (threshold or factor rule)"
    LEGACY: ClassVar[dict[str, str]] = {"threshold": "threshold", "factor": "factor"}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("threshold", UNIT_INTERVAL, unit_interval),
        Rule("factor", "a positive number", lambda v: v is None or (is_number(v) and v > 0)),
    )

    def arguments(self, gating: bool) -> dict:
        return dict(threshold=self.threshold, factor=self.factor)


def select(view: StepView, threshold: float, factor: float | None = None) -> torch.Tensor:
    if factor is None:
        commit = view.masked & (view.confidence >= threshold)
    else:
        commit = factor_rule(view, factor)
    return with_most_confident(commit, view)


def factor_rule(view: StepView, factor: float) -> torch.Tensor:
    ranks = rank_by_confidence(view)  # 0-based: the n-th highest has rank n - 1
    sorted_conf = torch.sort(masked_confidence(view), dim=1, descending=True).values
    n = torch.arange(1, sorted_conf.shape[1] + 1, device=sorted_conf.device, dtype=sorted_conf.dtype)
    passes = sorted_conf >= 1 - factor / (n + 1)
    # "while": the accepted prefix ends at the first rank that fails.
    accepted = passes.long().cumprod(dim=1).sum(dim=1)
    return view.masked & (ranks < accepted[:, None])
