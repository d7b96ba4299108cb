"""LLaDA's random remasking (its `remasking="random"`) as dKV-Cache-Greedy's official generate runs it
(horseee/dKV-Cache, generation_utils/llada_dkv_cache_greedy.py): at a block's start each position of the
block draws one uniform number (the request's own generator) and the block is decoded in decreasing
order of them, step t taking the next n // T positions (one more for the first n % T steps: vanilla's
linear schedule). The order is known before the forward, which is what lets dKV-Cache-Greedy compute
only the positions a step decodes (models/modes/dkv.py). The engine offers this policy only the
step's scheduled positions (OrderState.commit_only): it commits every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from caidllm.decode.policies.base import PolicyState, StepView
from caidllm.decode.sampling import request_generator


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
    return order[start : start + base + (step < extra)]


@dataclass
class OrderState(PolicyState):
    """A request's decoding order (request.policy_state): its own generator, reproducible without a seed
    too (seed 0, like the greedy decoders), and the current block's order, drawn at the block's start."""

    generator: torch.Generator
    order: list[int] | None = None

    def start_block(self, request) -> None:
        self.order = block_order(self.generator, request.config.block_length)

    def scheduled(self, request, step: int) -> list[int]:
        """The generated positions decoded at `step` of the request's current block."""
        block_start, block_end = request.block_bounds
        return [
            block_start + b
            for b in scheduled(self.order, block_end - block_start, step, request.config.steps_per_block)
        ]

    def commit_only(self, request) -> set[int]:
        """The block positions this step may commit: its share of the order."""
        return {p - request.block_bounds[0] for p in self.scheduled(request, request.step)}


def new_state(config, prompt: list[int]) -> OrderState:
    return OrderState(request_generator(config.seed or 0, prompt, "cpu"))
