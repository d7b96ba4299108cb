"""Commit policies (the decoders' commit rules): which masked positions of the block to commit at a step.

Each policy is one PolicySpec in POLICIES: its select function (a batched tensor
function of a StepView), the settings it takes from the DecodeConfig, and the
per-row state it keeps across steps. The valid values of DecodeConfig.policy
are the keys of POLICIES; rows whose policy and settings are equal share one
select call (the engine's grouping key is `policy_key`).

Adding a decoder: a module here with its select function, and one entry in
POLICIES (then a preset in decode/methods.py names it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from caidllm.decode.policies import (block_quota, cai, eb, margin, random_order, slowfast, subblock, threshold, vanilla,
                                     wino)
from caidllm.decode.policies.base import PolicyConfig, StepView
from caidllm.errors import InputError

Policy = Callable[[StepView], torch.Tensor]


@dataclass(frozen=True)
class PolicySpec:
    """One commit rule as the engine runs it.

    select: select(view, **settings) -> [R, block] bool, the positions to commit.
    settings: the keyword arguments select takes from a request's DecodeConfig and its
        confidence gating (resolved from the model's default); rows with equal settings (and
        steps per block) share one call.
    state_names: per-row state tensors kept across the steps of a block (one long per row,
        zeroed at each block start; the policy reads and writes them at view.rows).
    """

    select: Callable[..., torch.Tensor]
    settings: Callable[[PolicyConfig, bool], dict] = lambda config, gating: {}
    state_names: tuple[str, ...] = ()
    state_for: Callable[[PolicyConfig], tuple[str, ...]] | None = None  # state names that depend on settings
    needs_distribution: bool = False  # the view carries each position's entropy and second probability
    revises: bool = False  # may send committed tokens back to the mask (view.remask): reported once final
    forward: str | None = None  # a forward mode of its own, at every step (a name in models/modes: FORWARD_MODES)
    # new_state(config, prompt): the request's own memory beyond the state tensors (request.policy_state; may
    # offer start_block(request), commit_only(request) and a `generator` replayed on the other --tp ranks).
    new_state: Callable[[PolicyConfig, list[int]], object] | None = None
    # Steps a block may take; its last commits whatever is left (a decoder that re-masks may need more than T).
    step_limit: Callable[[PolicyConfig], int] = lambda config: config.steps_per_block
    # For a config whose forwards may end before the canvas does: horizon(state, block_masked) -> [1] long,
    # where the row's keys end in its block this step (SlowFast's official fast phase); None: never.
    horizon_for: Callable[[PolicyConfig], Callable | None] = lambda config: None


POLICIES: dict[str, PolicySpec] = {
    "vanilla": PolicySpec(vanilla.select, state_names=("n_masked",)),
    "margin": PolicySpec(margin.select, state_names=("n_masked",), needs_distribution=True),  # top-2 margin
    "threshold": PolicySpec(threshold.select,
                            lambda config, gating: dict(threshold=config.threshold, factor=config.factor)),
    "cai": PolicySpec(cai.select,
                      lambda config, gating: dict(s=config.cai, gating=gating, fixed_threshold=config.threshold),
                      state_names=("low_yield_steps",)),
    "eb": PolicySpec(eb.select, lambda config, gating: dict(gamma=config.eb_gamma, proxy=config.eb_proxy),
                     needs_distribution=True),
    "slowfast": PolicySpec(slowfast.select,
                           lambda config, gating: dict(explore_steps=config.sf_explore_steps,
                                                       cycle_threshold=config.sf_cycle_threshold,
                                                       window=config.sf_window, std_bound=config.sf_std,
                                                       high=config.sf_high),
                           state_for=lambda config: slowfast.state_names(config.sf_window),
                           horizon_for=lambda config: partial(slowfast.horizon, explore_steps=config.sf_explore_steps)
                           if config.sf_shortened else None),
    "wino": PolicySpec(wino.select, lambda config, gating: dict(draft=config.wino_draft, verify=config.wino_verify),
                       state_names=wino.STATE, revises=True, forward="verify",
                       step_limit=lambda config: config.wino_max_steps),
    # The request draws a decoding order at each block start and the policy is offered only the step's share.
    "random": PolicySpec(random_order.select, new_state=random_order.new_state),
    # The block-diffusion models' own (policies/block_quota.py): LLaDA2.x threshold decoding and SDAR's
    # low_confidence_dynamic are "dynamic" (LLaDA2.1: a fixed quota, num_to_transfer); SDAR's _static.
    "dynamic": PolicySpec(block_quota.select_dynamic,
                          lambda config, gating: dict(threshold=config.threshold, fixed_quota=config.num_to_transfer)),
    "static": PolicySpec(block_quota.select_static),
    # Fast-dLLM v2's (policies/subblock.py): threshold decoding one sub-block at a time, each block opened
    # by its autoregressive first token.
    "subblock": PolicySpec(subblock.select,
                           lambda config, gating: dict(threshold=config.threshold, sub_block=config.sub_block)),
}


def policy_spec(name: str) -> PolicySpec:
    spec = POLICIES.get(name)
    if spec is None:
        raise InputError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
    return spec


def make_policy(config: PolicyConfig, gating: bool) -> tuple[Policy, tuple[str, ...]]:
    """The request's select function (its settings bound) and the names of its state tensors."""
    spec = policy_spec(config.policy)
    settings = spec.settings(config, gating)
    state_names = spec.state_for(config) if spec.state_for is not None else spec.state_names
    return (partial(spec.select, **settings) if settings else spec.select), state_names


def policy_key(config: PolicyConfig, gating: bool) -> tuple:
    """Rows with equal keys run one select call: the same policy, settings and steps per block."""
    settings = policy_spec(config.policy).settings(config, gating)
    return (config.policy, config.steps_per_block) + tuple(
        (name, dataclasses.astuple(value) if dataclasses.is_dataclass(value) else value)
        for name, value in sorted(settings.items()))


__all__ = ["POLICIES", "Policy", "PolicySpec", "StepView", "make_policy", "policy_key", "policy_spec"]
