"""The block-diffusion models' own decoders: a per-step quota of commits per block.

Both spread the block's length over its T steps (block_length // T each, one more for
the first block_length % T steps: LLaDA2's and SDAR's transfer schedule, counted over the
whole block even where the block starts part prompt).
- "static" (SDAR's low_confidence_static): commit the quota's most confident masked positions.
- "dynamic" (SDAR's low_confidence_dynamic, and LLaDA2.x's threshold decoding, the same rule):
  commit every masked position whose confidence is strictly above the threshold when at least
  the quota of them pass; otherwise the quota's most confident ones.
LLaDA2.1 keeps the dynamic rule with a fixed quota (num_to_transfer) at every step.
The quota never exceeds the masked positions left (the official LLaDA2 loop's min()).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.decode.policies.base import PolicySettings, StepView, rank_by_confidence
from caidllm.setting_rules import BLOCK_CAUSAL, UNIT_INTERVAL, Rule, positive_int, unit_interval

STEP_CAP = Rule(
    "minimal_topk", "an integer >= 1", positive_int, models=BLOCK_CAUSAL, about="LLaDA2's step cap"
)


@dataclass
class StaticSettings(PolicySettings):
    """LLaDA2's minimal_topk caps the steps of a block at gen_length // minimal_topk (its official
    reading)."""

    minimal_topk: int = 1

    OWNER: ClassVar[str] = "static"
    TITLE: ClassVar[str] = "SDAR's low_confidence_static"
    LEGACY: ClassVar[dict[str, str]] = {"minimal_topk": "minimal_topk"}
    RULES: ClassVar[tuple[Rule, ...]] = (STEP_CAP,)

    def limit_steps(self, per_block: int, config) -> int:
        return min(per_block, config.gen_length // self.minimal_topk)


@dataclass
class DynamicSettings(StaticSettings):
    """The threshold, and LLaDA2.1's fixed quota per step (num_to_transfer) instead of the schedule (None)."""

    threshold: float = 0.9
    num_to_transfer: int | None = None

    OWNER: ClassVar[str] = "dynamic"
    TITLE: ClassVar[str] = "LLaDA2.x threshold decoding, SDAR's low_confidence_dynamic"
    LEGACY: ClassVar[dict[str, str]] = {
        name: name for name in ("threshold", "num_to_transfer", "minimal_topk")
    }
    RULES: ClassVar[tuple[Rule, ...]] = (
        STEP_CAP,
        Rule("threshold", UNIT_INTERVAL, unit_interval),
        Rule(
            "num_to_transfer",
            "an integer >= 1 (or None: the schedule)",
            lambda v: v is None or positive_int(v),
            models=BLOCK_CAUSAL,
            about="LLaDA2.1's quota per step",
        ),
    )

    def arguments(self, gating: bool) -> dict:
        return dict(threshold=self.threshold, fixed_quota=self.num_to_transfer)


def quota(block_length: int, step: int, total_steps: int) -> int:
    """Commits the transfer schedule asks for at `step` (0 once the steps outnumber the block)."""
    return block_length // total_steps + (step < block_length % total_steps)


def most_confident(view: StepView, k: int) -> torch.Tensor:
    return view.masked & (rank_by_confidence(view) < k)


def select_static(view: StepView) -> torch.Tensor:
    return most_confident(view, quota(view.block_length, view.step, view.total_steps))


def select_dynamic(view: StepView, threshold: float, fixed_quota: int | None = None) -> torch.Tensor:
    """fixed_quota: LLaDA2.1's num_to_transfer, the same quota at every step (None: the schedule)."""
    k = quota(view.block_length, view.step, view.total_steps) if fixed_quota is None else fixed_quota
    above = view.masked & (view.confidence > threshold)
    enough = above.sum(dim=1, keepdim=True) >= k
    return torch.where(enough, above, most_confident(view, k))
