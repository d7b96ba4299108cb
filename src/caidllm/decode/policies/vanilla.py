"""LLaDA low-confidence remasking with the linear per-block transfer schedule.

With n masked tokens at the block's start and T steps, step t commits
n // T tokens, plus one more for the first n % T steps: the most confident
masked ones. At T = block length this is one token per step.
"""

from __future__ import annotations

import torch

from caidllm.decode.policies.base import StepView, rank_by_confidence


def tokens_at_step(n_masked: torch.Tensor, step: int, total_steps: int) -> torch.Tensor:
    """The linear schedule: how many tokens each row commits at `step`."""
    return n_masked // total_steps + (step < n_masked % total_steps).long()


def select(view: StepView) -> torch.Tensor:
    if view.step == 0:
        view.state["n_masked"][view.rows] = view.masked.sum(dim=1)
    k = tokens_at_step(view.state["n_masked"][view.rows], view.step, view.total_steps)
    return view.masked & (rank_by_confidence(view) < k[:, None])
