"""Commit policies: which masked positions of the block to commit at a step.

`make_policy(config, gating)` returns a function of a StepView, plus the
names of the per-row state tensors it keeps across steps.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from caidllm.decode.config import DecodeConfig
from caidllm.decode.policies import block_quota, cai, threshold, vanilla
from caidllm.decode.policies.base import StepView
from caidllm.errors import InputError

Policy = Callable[[StepView], torch.Tensor]


def _vanilla(config: DecodeConfig, gating: bool):
    return vanilla.select, ("n_masked",)


def _threshold(config: DecodeConfig, gating: bool):
    return partial(threshold.select, threshold=config.threshold, factor=config.factor), ()


def _cai(config: DecodeConfig, gating: bool):
    return partial(cai.select, s=config.cai, gating=gating, fixed_threshold=config.threshold), ("low_yield_steps",)


def _dynamic(config: DecodeConfig, gating: bool):
    return partial(block_quota.select_dynamic, threshold=config.threshold, fixed_quota=config.num_to_transfer), ()


def _static(config: DecodeConfig, gating: bool):
    return block_quota.select_static, ()


# DecodeConfig.policy -> builder of (policy function, names of its per-row state tensors).
POLICY_BUILDERS: dict[str, Callable[[DecodeConfig, bool], tuple[Policy, tuple[str, ...]]]] = {
    "vanilla": _vanilla,
    "threshold": _threshold,
    "cai": _cai,
    "dynamic": _dynamic,
    "static": _static,
}


def make_policy(config: DecodeConfig, gating: bool) -> tuple[Policy, tuple[str, ...]]:
    builder = POLICY_BUILDERS.get(config.policy)
    if builder is None:
        raise InputError(f"unknown policy {config.policy!r}; choose one of {', '.join(POLICY_BUILDERS)}")
    return builder(config, gating)


__all__ = ["StepView", "make_policy", "Policy", "POLICY_BUILDERS"]
