"""`diffusiongemma-cai`: CAI-dLLM's first-step control (paper Boxes 2-7, Algorithm 1) carried to
uniform-state diffusion (docs/diffusion-gemma.md, "A CAI-style decoder", says what carried over and how).

There is no mask to commit: a step *accepts* positions (they keep their new token) and renoises the rest,
and every position is drawn again at the next step. The official rule accepts the lowest-entropy positions
under one cumulative bound. This rule accepts that set and, besides it, each position under its own bound:

- s_i, the entropy of position i at the canvas's first step (the signal of Box 2, entropy for confidence:
  the quantity the official sampler already computes), sorts positions into easy / normal / hard;
- a per-position entropy bound tau(t) held at entropy_start for the first warmup * N steps, then relaxed
  by a cosine up to the canvas's end bound (Box 3), which loosens with the canvas index (Box 4);
- tau_i(t) = tau(t) * difficulty factor (easy looser, hard stricter: our addition, the paper uses s_i for
  budgets only) * position factor (by quarter of the canvas, Box 6's factors inverted for an entropy);
- budgets (Box 5, `gating`): an easy position in the first half is always accepted from step N/6 on, a
  normal one from 2N/3 on, with its argmax (the paper's force commit); a hard or last-quarter one never is;
- grinding (Box 7): when the argmax changes at fewer than grinding_yield * L positions for
  grinding_patience steps in a row and the mean entropy is under fallback_entropy, the canvas ends (its
  output is the argmax canvas, as at any end); the official stable-and-confident stop still applies.
Everything it keeps is per request and per canvas (r.rule_state): a request's tokens do not depend on its
batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.checks import are_numbers, is_number
from caidllm.decode.diffusiongemma_rule import EntropyBoundRule, StepDraws, accepted_positions
from caidllm.errors import InputError
from caidllm.setting_rules import MethodSettings, Rule, boolean, non_negative, positive_int

SWITCHES = ("canvas_schedule", "difficulty_factors", "position_factors", "gating", "grinding")


def _positive_numbers(count: int):
    return lambda v: are_numbers(v, count) and all(f > 0 for f in v)


@dataclass
class CaiUniformSettings(MethodSettings):
    """The controller's constants; each switch turns one component off (an ablation)."""

    canvas_schedule: bool = True  # the end bound loosens with the canvas index (Box 4)
    difficulty_factors: bool = True  # easy / hard positions' bound scaled by s_i (our addition)
    position_factors: bool = True  # the bound scaled by quarter of the canvas (Box 6)
    gating: bool = True  # budgets: easy and normal positions always accepted after their steps (Box 5)
    grinding: bool = True  # the low-yield exit (Box 7)
    entropy_start: float = 0.05  # per-position entropy bound (nats) of the first warmup * N steps
    entropy_end: float = 0.5  # the bound the cosine reaches at the last step of the first canvas
    warmup: float = 0.15  # fraction w of max_denoising_steps held at entropy_start
    canvas_relax: float = 0.25  # end bound of canvas b (from 0): entropy_end + canvas_relax * b, ...
    entropy_end_cap: float = 1.0  # ... at most this
    easy_entropy: float = 0.5  # s_i at most this: easy
    hard_entropy: float = 2.0  # s_i at least this: hard
    difficulty: tuple[float, float] = (1.5, 0.5)  # the bound's factor for easy, hard positions
    factors: tuple[float, float, float, float] = (1.25, 1.1, 0.95, 0.9)  # by quarter of the canvas
    budget_fractions: tuple[float, float] = (1 / 6, 2 / 3)  # of N: easy (first half), normal
    grinding_yield: float = 0.015  # a step whose argmax changes at fewer than this * L positions is low
    grinding_patience: int = 4  # K low-yield steps in a row end the canvas ...
    fallback_entropy: float = 1.0  # ... when its mean entropy is under this (nats)

    OWNER: ClassVar[str] = "dgcai"
    TITLE: ClassVar[str] = "CAI-style first-step control for uniform-state diffusion"
    RULES: ClassVar[tuple[Rule, ...]] = (
        *(Rule(name, "True or False", boolean) for name in SWITCHES),
        *(
            Rule(name, "a number >= 0", non_negative)
            for name in ("entropy_start", "entropy_end", "canvas_relax", "entropy_end_cap")
        ),
        *(Rule(name, "a number >= 0", non_negative) for name in ("easy_entropy", "hard_entropy")),
        Rule("warmup", "in [0, 1)", lambda v: is_number(v) and 0 <= v < 1),
        Rule("difficulty", "two positive numbers", _positive_numbers(2)),
        Rule("factors", "four positive numbers", _positive_numbers(4)),
        Rule(
            "budget_fractions",
            "two numbers in (0, 1]",
            lambda v: are_numbers(v, 2) and all(0 < f <= 1 for f in v),
        ),
        Rule("grinding_yield", "in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
        Rule("grinding_patience", "an integer >= 1", positive_int),
        Rule("fallback_entropy", "a number > 0", lambda v: is_number(v) and v > 0),
    )

    def validate(self) -> CaiUniformSettings:
        self.check({})
        for low, high in (("entropy_start", "entropy_end"), ("easy_entropy", "hard_entropy")):
            a, b = getattr(self, low), getattr(self, high)
            if a > b:
                raise InputError(
                    f"dgcai.{low} ({a}) must not exceed dgcai.{high} ({b})",
                    field=f"dgcai.{low}",
                )
        easy, normal = self.budget_fractions
        if easy > normal:  # an easy position's budget comes first (Box 5's 8 / 32 of T)
            raise InputError(
                f"dgcai.budget_fractions: the easy positions' ({easy}) must not exceed the normal ones' "
                f"({normal})",
                field="dgcai.budget_fractions",
            )
        return self


@dataclass
class CanvasControl:
    """What the controller keeps of a canvas: from its first step, each position's bound factor and
    budget; the count of low-yield steps in a row."""

    factor: torch.Tensor  # [L] float
    budget: torch.Tensor  # [L] long: the step from which the position is always accepted
    low_steps: int = 0


def canvas_control(c: CaiUniformSettings, first_entropy: torch.Tensor, steps: int) -> CanvasControl:
    """The per-position factors and budgets of a canvas from its first step's entropies (Boxes 2, 5, 6)."""
    L = first_entropy.shape[0]
    quarter = torch.arange(L, device=first_entropy.device) * 4 // L
    easy, hard = first_entropy <= c.easy_entropy, first_entropy >= c.hard_entropy
    factor = torch.ones(L, dtype=torch.float32, device=first_entropy.device)
    if c.difficulty_factors:
        factor = torch.where(easy, c.difficulty[0], torch.where(hard, c.difficulty[1], factor))
    if c.position_factors:
        factor = factor * torch.tensor(c.factors, dtype=torch.float32, device=factor.device)[quarter]
    easy_budget, normal_budget = (max(1, math.ceil(f * steps)) for f in c.budget_fractions)
    budget = torch.full((L,), normal_budget, dtype=torch.long, device=first_entropy.device)
    budget = torch.where(easy & (quarter < 2), easy_budget, budget)
    budget = torch.where(hard | (quarter == 3), steps, budget)  # never reached: t < steps
    return CanvasControl(factor=factor, budget=budget)


def entropy_bound_at(c: CaiUniformSettings, step: int, steps: int, canvas: int) -> float:
    """tau(t) of canvas `canvas` (from 0): entropy_start during the warmup, then a cosine up to the end
    bound (Boxes 3 and 4, an entropy bound relaxing where the paper's confidence threshold lowers)."""
    end = c.entropy_end
    if c.canvas_schedule:
        end = min(end + c.canvas_relax * canvas, max(c.entropy_end_cap, c.entropy_end))
    start_relaxing = c.warmup * steps
    if step < start_relaxing:
        return c.entropy_start
    u = (step - start_relaxing) / max(steps - 1 - start_relaxing, 1)
    return end + (c.entropy_start - end) / 2 * (1 + math.cos(math.pi * min(u, 1.0)))


class CaiUniformRule(EntropyBoundRule):
    """The official acceptance, widened per position from the canvas's first step; the official stop or
    the low-yield exit."""

    def accept(self, r, draws: StepDraws) -> tuple[torch.Tensor, torch.Tensor]:
        s, c, t = r.settings, r.settings.decoder_settings, r.step
        if t == 0:
            r.rule_state = canvas_control(c, draws.entropy, s.max_denoising_steps)
        control: CanvasControl = r.rule_state
        tau = entropy_bound_at(c, t, s.max_denoising_steps, len(r.steps_per_canvas))
        accept = accepted_positions(draws.entropy, s.entropy_bound) | (draws.entropy <= tau * control.factor)
        tokens = draws.tokens
        if c.gating:
            forced = control.budget <= t
            accept = accept | forced
            tokens = torch.where(forced, draws.argmax, tokens)  # the force commit takes the argmax
        return accept, tokens

    def stop(self, r, draws: StepDraws) -> bool:
        official = super().stop(r, draws)  # records the stability history whatever happens next
        c, control = r.settings.decoder_settings, r.rule_state
        if not c.grinding or r.step == 0:  # a first step's "changes" are against the random canvas
            return official
        changed = int((draws.argmax != r.argmax).sum())
        low = changed < c.grinding_yield * draws.argmax.shape[0]
        control.low_steps = control.low_steps + 1 if low else 0
        grinding = control.low_steps >= c.grinding_patience
        return official or (grinding and bool(draws.entropy.mean() < c.fallback_entropy))
