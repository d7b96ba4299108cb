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

import torch

from caidllm.decode.policies.base import StepView, rank_by_confidence


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
