"""LLaDA's random remasking (its `remasking="random"`) as dKV-Cache-Greedy's official generate runs it
(horseee/dKV-Cache, generation_utils/llada_dkv_cache_greedy.py): at a block's start each position of the
block draws one uniform number (the request's own generator) and the block is decoded in decreasing
order of them, step t taking the next n // T positions (one more for the first n % T steps: vanilla's
linear schedule). The order is known before the forward, which is what lets dKV-Cache-Greedy compute
only the positions a step decodes (models/modes/dkv.py). The engine offers this policy only the
step's scheduled positions (Request.commit_only): it commits every one of them.
"""

from __future__ import annotations

import torch

from caidllm.decode.policies.base import StepView


def select(view: StepView) -> torch.Tensor:
    return view.masked.clone()


def block_order(generator: torch.Generator, block_length: int) -> list[int]:
    """The block's positions in the order they are decoded (largest draw first)."""
    draws = torch.rand(block_length, generator=generator, dtype=torch.float64)
    return torch.sort(draws, descending=True, stable=True).indices.tolist()


def scheduled(order: list[int], n_masked: int, step: int, total_steps: int) -> list[int]:
    """The positions (in order) decoded at `step`: the linear schedule's share of the order."""
    base, extra = divmod(n_masked, total_steps)
    start = step * base + min(step, extra)
    return order[start:start + base + (step < extra)]
