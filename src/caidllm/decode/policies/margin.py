"""Top-2 margin decoding: LLaDA's linear per-block schedule (policies/vanilla.py: n // T positions a
step, one more for the first n % T steps), committing the masked positions whose two most probable
tokens lie furthest apart instead of those with the highest probability. A position whose best two
tokens are close is an ambiguous one: it waits for more context.

The margin is Dream's ``alg="topk_margin"`` confidence (Dream-org/Dream, ``generation_utils.py``) and
the "top probability margin" order of Kim et al., "Train for the Worst, Plan for the Best: Understanding
Token Ordering in Masked Diffusions" (arXiv 2502.06768). At temperature 0 it is p1 - p2 (the engine's
StepView gives p1 as the confidence and p2 as `second`); sampling, it is the drawn token's probability
minus the second-highest. Ties go to the leftmost position.
"""

from __future__ import annotations

import dataclasses

import torch

from caidllm.decode.policies.base import StepView, rank_by_confidence
from caidllm.decode.policies.vanilla import tokens_at_step


def select(view: StepView) -> torch.Tensor:
    if view.step == 0:  # the schedule counts the masks at the block's start
        view.state["n_masked"][view.rows] = view.masked.sum(dim=1)
    k = tokens_at_step(view.state["n_masked"][view.rows], view.step, view.total_steps)
    by_margin = dataclasses.replace(view, confidence=view.confidence - view.second)
    return view.masked & (rank_by_confidence(by_margin) < k[:, None])
