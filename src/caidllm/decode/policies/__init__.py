"""Commit policies (the decoders' commit rules): which masked positions of the block to commit at a step.

Each policy is one PolicySpec in POLICIES: its select function (a batched tensor
function of a StepView), its settings dataclass (declared next to it, with its field
rules), and the per-row state it keeps across steps. The valid values of DecodeConfig.policy
are the keys of POLICIES; rows whose policy and settings are equal share one
select call (the engine's grouping key is `policy_key`).

Adding a decoder: a module here with its select function and its settings dataclass, and
one entry in POLICIES (then a preset in decode/methods.py names it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from caidllm.decode.policies import (
    block_quota,
    cai,
    cai_prophet,
    eb,
    indel,
    klass,
    localleap,
    margin,
    prophet,
    random_order,
    s2d2,
    slowfast,
    subblock,
    threshold,
    vanilla,
    wino,
)
from caidllm.decode.policies.base import NoSettings, PolicyConfig, PolicySettings, StepView
from caidllm.errors import InputError
from caidllm.setting_rules import BLOCK_CAUSAL

Policy = Callable[[StepView], torch.Tensor]


@dataclass(frozen=True)
class PolicySpec:
    """One commit rule as the engine runs it.

    select: select(view, **settings.arguments(gating)) -> [R, block] bool, the positions to commit.
    settings_type: the policy's settings (a PolicySettings dataclass next to its select function: its
        fields, their rules, its flat names of earlier versions); rows with equal arguments (and steps
        per block) share one call.
    state_names: per-row state tensors kept across the steps of a block (one long per row,
        zeroed at each block start; the policy reads and writes them at view.rows); settings may
        name their own (PolicySettings.state_names).
    """

    select: Callable[..., torch.Tensor]
    settings_type: type[PolicySettings] = NoSettings
    state_names: tuple[str, ...] = ()
    needs_distribution: bool = False  # the view carries each position's entropy and second probability
    needs_probabilities: bool = False  # the view carries each position's whole distribution (float64)
    # The forward returns the whole generation's logits (view.generation_logits) and the policy may end a
    # request at once (view.finish: every mask left takes its prediction), as Prophet's early exit.
    sees_generation: bool = False
    revises: bool = False  # may send committed tokens back to the mask (view.remask): reported once final
    # rewrites its block whole (LLaDA2.2's InDel: indel.rewrite_rows, its content may shift) with the model's
    # edit tokens (ModelConfig.edit_tokens); the block is committed and reported once it ends
    rewrites: bool = False
    forward: str | None = (
        None  # a forward mode of its own, at every step (a name in models/modes: FORWARD_MODES)
    )
    # new_state(config, prompt): the request's own memory beyond the state tensors (request.policy_state; may
    # offer start_block(request), commit_only(request) and a `generator` replayed on the other --tp ranks).
    new_state: Callable[[PolicyConfig, list[int]], object] | None = None
    # The only kind of model it decodes (setting_rules.BLOCK_CAUSAL: a block-diffusion model's own decoder);
    # None: any (on a block-causal model, over its exact block cache).
    models: str | None = None
    # The preset that runs this rule on a block-causal model's exact block cache: the advice where the chosen
    # method's cache needs bidirectional attention (ES-dLLM's, Elastic-Cache's, dKV-Cache's).
    block_causal_method: str = "fastdllm"
    # After its draft forward it may run one more forward per row, the block read at block size 1
    # (models/selfspec.py), through view.self_spec; it may commit tokens of its own (view.tokens).
    self_verifies: bool = False


POLICIES: dict[str, PolicySpec] = {
    "vanilla": PolicySpec(vanilla.select, state_names=("n_masked",), block_causal_method="vanilla"),
    "margin": PolicySpec(margin.select, state_names=("n_masked",), needs_distribution=True),  # top-2 margin
    "threshold": PolicySpec(threshold.select, threshold.ThresholdSettings),
    "cai": PolicySpec(
        cai.select, cai.CAISettings, state_names=("low_yield_steps",), block_causal_method="cai"
    ),
    "eb": PolicySpec(eb.select, eb.EBSettings, needs_distribution=True),
    "slowfast": PolicySpec(slowfast.select, slowfast.SlowFastSettings),
    "wino": PolicySpec(
        wino.select, wino.WinoSettings, state_names=wino.STATE, revises=True, forward="verify"
    ),
    # KLASS: every confident position whose distribution has stayed put for `history` steps, else the
    # schedule.
    "klass": PolicySpec(
        klass.select,
        klass.KlassSettings,
        state_names=("n_masked",),
        needs_probabilities=True,
        new_state=klass.new_state,
    ),
    # Prophet: LLaDA's schedule until the answer's top-2 logit gap says it has converged, then everything at
    # once.
    "prophet": PolicySpec(
        prophet.select, prophet.ProphetSettings, state_names=("n_masked",), sees_generation=True
    ),
    # CAI's controller until Prophet's watch says the answer has converged, then everything at once.
    "cai-prophet": PolicySpec(
        cai_prophet.select,
        cai_prophet.CAIProphetSettings,
        state_names=("low_yield_steps",),
        sees_generation=True,
        block_causal_method="cai",
    ),
    # LocalLeap: Fast-dLLM's threshold, relaxed within a radius of this step's anchors.
    "localleap": PolicySpec(localleap.select, localleap.LocalLeapSettings),
    # The request draws a decoding order at each block start and the policy is offered only the step's share.
    "random": PolicySpec(
        random_order.select, new_state=random_order.new_state, block_causal_method="vanilla"
    ),
    # The block-diffusion models' own (policies/block_quota.py): LLaDA2.x threshold decoding and SDAR's
    # low_confidence_dynamic are "dynamic" (LLaDA2.1: a fixed quota, num_to_transfer); SDAR's _static.
    "dynamic": PolicySpec(block_quota.select_dynamic, block_quota.DynamicSettings, models=BLOCK_CAUSAL),
    "static": PolicySpec(block_quota.select_static, block_quota.StaticSettings, models=BLOCK_CAUSAL),
    # Fast-dLLM v2's (policies/subblock.py): threshold decoding one sub-block at a time, each block opened
    # by its autoregressive first token.
    "subblock": PolicySpec(subblock.select, subblock.SubblockSettings, models=BLOCK_CAUSAL),
    # LLaDA2.2's (policies/indel.py): joint threshold decoding with DELETE / SPLIT edits, SGLang's
    # JointThresholdInDel.
    "indel": PolicySpec(
        indel.select, indel.IndelSettings, new_state=indel.new_state, models=BLOCK_CAUSAL, rewrites=True
    ),
    # S2D2 (policies/s2d2.py): a draft, a router, and verification by the same weights at block size 1.
    "s2d2": PolicySpec(
        s2d2.select, s2d2.S2D2Settings, new_state=s2d2.new_state, models=BLOCK_CAUSAL, self_verifies=True
    ),
}


def policy_spec(name: str) -> PolicySpec:
    spec = POLICIES.get(name)
    if spec is None:
        raise InputError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}", field="policy")
    return spec


def make_policy(config: PolicyConfig, gating: bool) -> tuple[Policy, tuple[str, ...]]:
    """The request's select function (its settings bound) and the names of its state tensors."""
    spec = policy_spec(config.policy)
    settings = config.policy_settings.arguments(gating)
    state_names = config.policy_settings.state_names()
    return (partial(spec.select, **settings) if settings else spec.select), (
        spec.state_names if state_names is None else state_names
    )


def policy_key(config: PolicyConfig, gating: bool) -> tuple:
    """Rows with equal keys run one select call: the same policy, settings and steps per block."""
    settings = config.policy_settings.arguments(gating)
    return (config.policy, config.steps_per_block) + tuple(
        (name, dataclasses.astuple(value) if dataclasses.is_dataclass(value) else value)
        for name, value in sorted(settings.items())
    )


__all__ = [
    "POLICIES",
    "NoSettings",
    "Policy",
    "PolicySettings",
    "PolicySpec",
    "StepView",
    "make_policy",
    "policy_key",
    "policy_spec",
]
