"""What a policy sees at one denoising step, and helpers shared by policies.

A policy only decides which masked positions of the current block to commit.
It is a batched tensor function of a `StepView`: R rows (the rows computed at
this step) by the block's positions. Per-row state that must survive from one
step to the next (CAI's low-yield counter, vanilla's per-row token count) lives
in `state`, a dict of tensors with one entry per row of the full batch, which
the policy reads and writes at `view.rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from caidllm.setting_rules import MethodSettings


class PolicyConfig(Protocol):
    """A request's decoding settings as the policies read them: a DecodeConfig (decode/config.py). The
    config sits above the policies (it checks its values against their registry), so they name it by
    this protocol and never import it (no import circle, type-only imports included)."""

    policy: str
    block_length: int
    policy_settings: PolicySettings


class PolicySettings(MethodSettings):
    """A policy's settings (setting_rules.MethodSettings), plus what its select function takes of them."""

    def arguments(self, gating: bool) -> dict:
        """The keyword arguments of the policy's select function (rows with equal ones share a call)."""
        return {}

    def state_names(self) -> tuple[str, ...] | None:
        """Per-row state tensors that depend on the settings (None: the policy's fixed ones)."""
        return None

    def step_limit(self, config) -> int:
        """Steps a block may take (its last commits whatever is left): the schedule's T, unless a
        decoder that re-masks needs more."""
        return config.steps_per_block

    def horizon(self):
        """horizon(state, block_masked) -> [1] long, where the row's keys end in its block this step, for
        settings whose forwards may end before the canvas does (SlowFast's official fast phase); None:
        never."""
        return None

    def causal_span(self):
        """causal_span(request, block_masked [block] bool, block_position [] long) -> [2] long, the RoPE
        positions [lo, hi) whose queries attend token-causally this step (models/layers.Context.causal_span),
        for settings whose forwards are partly autoregressive (S2D2's AR-like caching); None: never."""
        return None

    def check_model(self, config, model) -> None:
        """Refuse settings a block-causal model cannot take (InputError naming the field); `model` is its
        ModelConfig or block_diffusion.ModelTraits (family, block_causal, block_lengths)."""


@dataclass
class NoSettings(PolicySettings):
    """A policy with no settings of its own (vanilla, random order)."""


class PolicyState:
    """A request's own memory for its policy beyond the per-row state tensors (PolicySpec.new_state makes
    it; request.policy_state holds it). The engine calls these hooks; a policy overrides what it needs."""

    generator: torch.Generator | None = None  # a generator of its own (replayed on the other --tp ranks)

    def start_block(self, request) -> None:
        """The request's block starts (request.block is the new block)."""

    def commit_only(self, request) -> set[int] | None:
        """The block positions this step may commit (None: any masked one)."""
        return None


@dataclass
class StepView:
    confidence: torch.Tensor  # [R, block] probability of the predicted token
    predicted: torch.Tensor  # [R, block] predicted token ids
    masked: torch.Tensor  # [R, block] True where the position is still a mask token
    first_confidence: torch.Tensor  # [R, block] s_i = confidence at the block's first step
    step: int  # local step t within the block, 0 .. total_steps - 1
    total_steps: int  # T, the maximum number of steps of a block
    block_index: int  # 0-based index of the block in the generation
    rows: torch.Tensor  # [R] indices of these rows in the full batch
    state: dict[str, torch.Tensor]
    # Only for policies that ask for them (`needs_distribution`): each position's entropy (nats) and
    # second-highest probability under the un-noised distribution (mask token excluded).
    entropy: torch.Tensor | None = None  # [R, block]
    second: torch.Tensor | None = None  # [R, block]
    # Only for policies that verify (`revises`): each position's probability of its current token when
    # the position itself is hidden (WINO's shadow block); and what the policy sends back to the mask.
    verify_confidence: torch.Tensor | None = None  # [R, block]
    remask: torch.Tensor | None = None  # [R, block] bool, set by the policy
    # Only for policies that ask for them (`needs_probabilities`): each position's whole distribution
    # (float64, the mask token's probability 0); and for policies with a state object (`new_state`), each
    # row's.
    probabilities: torch.Tensor | None = None  # [R, block, V]
    policy_states: list | None = None  # [R] request.policy_state
    # Only for policies that see the whole generation (`sees_generation`): its logits (the mask token's at
    # -inf); such a policy may set `finish`: [R] bool, the rows whose every mask left takes its prediction
    # now.
    generation_logits: torch.Tensor | None = None  # [R, span, V]
    finish: torch.Tensor | None = None  # [R] bool, set by the policy
    # Only for policies that verify with a forward of their own (`self_verifies`, S2D2): the draft logits,
    # the block's tokens and the verify forward (decode/runner.py: SelfSpec); and the tokens the policy
    # commits where they are not the prediction (its own draws), set by the policy.
    self_spec: object | None = None
    tokens: torch.Tensor | None = None  # [R, block] long

    @property
    def block_length(self) -> int:
        return self.masked.shape[1]


def masked_confidence(view: StepView) -> torch.Tensor:
    """Confidences with non-masked positions set to -inf, so they never win."""
    return view.confidence.masked_fill(~view.masked, float("-inf"))


def with_most_confident(commit: torch.Tensor, view: StepView) -> torch.Tensor:
    """Add each row's most confident masked position to `commit`, so every step
    makes progress (the rule of confidence-based parallel decoding)."""
    scores = masked_confidence(view)
    best = scores.argmax(dim=1, keepdim=True)
    has_mask = view.masked.any(dim=1, keepdim=True)
    forced = torch.zeros_like(commit).scatter_(1, best, True) & has_mask
    return commit | forced


def rank_by_confidence(view: StepView) -> torch.Tensor:
    """Rank (0 = most confident) of each position among masked positions of
    its row; ties go to the leftmost position. Non-masked positions rank last."""
    order = torch.sort(masked_confidence(view), dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return ranks.scatter_(1, order, positions)


def probabilities(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[R, n, V] float64 softmax of the logits with the mask token excluded (its probability 0)."""
    logits = logits.double()
    logits[..., mask_id] = float("-inf")
    return torch.softmax(logits, dim=-1)


def distribution_stats(logits: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (nats) and second-highest probability of each position's predictive
    distribution, the mask token excluded (as it is from prediction). logits: [R, n, V]."""
    logits = logits.float().clone()
    logits[..., mask_id] = float("-inf")
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    entropy = -(p * log_p.masked_fill(p == 0, 0)).sum(dim=-1)
    second = p.topk(2, dim=-1).values[..., 1]
    return entropy, second
