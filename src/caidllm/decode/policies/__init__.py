"""Commit policies: which masked positions of the block to commit at a step.

`make_policy(config, gating)` returns a function of a StepView, plus the
names of the per-row state tensors it keeps across steps.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from caidllm.decode.config import DecodeConfig
from caidllm.decode.policies import cai, eb, slowfast, threshold, vanilla, wino
from caidllm.decode.policies.base import StepView
from caidllm.errors import InputError

Policy = Callable[[StepView], torch.Tensor]


def _vanilla(config: DecodeConfig, gating: bool):
    return vanilla.select, ("n_masked",)


def _threshold(config: DecodeConfig, gating: bool):
    return partial(threshold.select, threshold=config.threshold, factor=config.factor), ()


def _cai(config: DecodeConfig, gating: bool):
    return partial(cai.select, s=config.cai, gating=gating, fixed_threshold=config.threshold), ("low_yield_steps",)


def _eb(config: DecodeConfig, gating: bool):
    policy = partial(eb.select, gamma=config.eb_gamma, proxy=config.eb_proxy)
    policy.needs_distribution = True
    return policy, ()


def _slowfast(config: DecodeConfig, gating: bool):
    policy = partial(slowfast.select, explore_steps=config.sf_explore_steps, cycle_threshold=config.sf_cycle_threshold,
                     window=config.sf_window, std_bound=config.sf_std, high=config.sf_high)
    return policy, slowfast.state_names(config.sf_window)


def _wino(config: DecodeConfig, gating: bool):
    policy = partial(wino.select, draft=config.wino_draft, verify=config.wino_verify)
    policy.revises = True
    return policy, wino.STATE


# DecodeConfig.policy -> builder of (policy function, names of its per-row state tensors).
POLICY_BUILDERS: dict[str, Callable[[DecodeConfig, bool], tuple[Policy, tuple[str, ...]]]] = {
    "vanilla": _vanilla,
    "threshold": _threshold,
    "cai": _cai,
    "eb": _eb,
    "slowfast": _slowfast,
    "wino": _wino,
}


def make_policy(config: DecodeConfig, gating: bool) -> tuple[Policy, tuple[str, ...]]:
    builder = POLICY_BUILDERS.get(config.policy)
    if builder is None:
        raise InputError(f"unknown policy {config.policy!r}; choose one of {', '.join(POLICY_BUILDERS)}")
    return builder(config, gating)


__all__ = ["StepView", "make_policy", "Policy", "POLICY_BUILDERS"]
