"""Commit policies: which masked positions of the block to commit at a step.

`make_policy(config, gating)` returns a function of a StepView, plus the
names of the per-row state tensors it keeps across steps.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from caidllm.decode.config import DecodeConfig
from caidllm.decode.policies import cai, threshold, vanilla
from caidllm.decode.policies.base import StepView

Policy = Callable[[StepView], torch.Tensor]


def make_policy(config: DecodeConfig, gating: bool) -> tuple[Policy, tuple[str, ...]]:
    if config.policy == "vanilla":
        return vanilla.select, ("n_masked",)
    if config.policy == "threshold":
        return partial(threshold.select, threshold=config.threshold, factor=config.factor), ()
    return partial(cai.select, s=config.cai, gating=gating, fixed_threshold=config.threshold), ("low_yield_steps",)


__all__ = ["StepView", "make_policy", "Policy"]
