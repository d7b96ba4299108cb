"""CAI-dLLM: the confidence-aware controller (paper Boxes 2-7, Algorithm 1).

The engine stores s_i = c_i(0), each token's confidence at the block's first
forward, and hands it in as `view.first_confidence`. From it and the step t:

- block threshold theta_b(t): theta_s for t < wT, then a cosine from theta_s
  down to the block's end threshold theta_e(b) (Boxes 3 and 4);
- token threshold theta_i(t) = clip(theta_b(t) * r_pos(i), 0.20, 0.98), r by
  quarter of the block (Box 6);
- with confidence gating on: budgets B_i from s_i and position force a commit
  at t >= B_i (Box 5), and after K low-yield steps in a row every masked token
  with c > 0.40 is committed (Box 7, DESIGN.md's reading: the block then goes
  on, the counter reset); with grinding_action="exit" the block ends there
  instead (Algorithm 1's break): every masked token is committed with its
  current prediction, so the engine sees no mask left and moves on.
At least the most confident masked token is committed at every step.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from caidllm.checks import are_numbers, is_number
from caidllm.decode.policies.base import PolicySettings, StepView, with_most_confident
from caidllm.errors import InputError
from caidllm.setting_rules import (
    UNIT_INTERVAL,
    Rule,
    boolean,
    choice_rule,
    named,
    non_negative,
    positive_int,
    unit_interval,
)

# What the controller does after K low-yield steps (Box 7): "continue" commits the masked tokens above the
# fallback threshold and goes on; "exit" ends the block, committing every still-masked position with its
# current prediction in that same step (Algorithm 1's `break`, without leaving a mask behind).
GRINDING_ACTIONS = ("continue", "exit")
UNIT_FIELDS = (
    "theta_start",
    "theta_end",
    "block_end_floor",
    "fallback_threshold",
    "clip_low",
    "clip_high",
    "easy_confidence",
    "hard_confidence",
)


@dataclass
class CAISettings(PolicySettings):
    """CAI-dLLM controller constants. Each switch turns one component on or off
    (the paper's ablation: fixed threshold vs APD, +block schedule, +position
    factors, +budgets/grinding)."""

    adaptive: bool = True  # cosine schedule (APD); False = the fixed `threshold`
    block_schedule: bool = True  # end threshold decreases with the block index (Box 4)
    position_factors: bool = True  # per-quarter factors on the threshold (Box 6)
    gating: bool | None = None  # budgets + grinding fallback (Boxes 5, 7); None = model default
    theta_start: float = 0.90
    theta_end: float = 0.70  # end threshold of block 1 (and of every block without the block schedule)
    warmup: float = 0.15  # fraction w of the block's steps held at theta_start
    block_end_decay: float = 0.10  # theta_e(b) = max(theta_end - decay * (b - 1), floor)
    block_end_floor: float = 0.40
    factors: tuple[float, float, float, float] = (0.80, 0.90, 1.05, 1.10)  # by quarter of the block
    clip_low: float = 0.20
    clip_high: float = 0.98
    easy_confidence: float = 0.50  # s_i above this (and in the first half) -> short budget
    hard_confidence: float = 0.25  # s_i below this (or in the last quarter) -> full budget
    # of T: easy / normal / hard (8/32/64 at T=64)
    budget_fractions: tuple[float, float, float] = (
        1 / 8,
        1 / 2,
        1.0,
    )
    grinding_yield: float = 1.5  # a step committing fewer tokens than this is low-yield
    grinding_patience: int = 4  # K low-yield steps in a row trigger the fallback
    fallback_threshold: float = 0.40  # on grinding, commit masked tokens with c > this ("continue")
    grinding_action: str = "continue"  # GRINDING_ACTIONS: go on after the fallback, or end the block there
    threshold: float = 0.9  # the fixed threshold, read with adaptive=False only

    OWNER: ClassVar[str] = "cai"
    TITLE: ClassVar[str] = "CAI-dLLM's confidence-aware controller"
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("threshold", UNIT_INTERVAL, unit_interval),
        *(Rule(name, UNIT_INTERVAL, unit_interval) for name in UNIT_FIELDS),
        Rule("warmup", "in [0, 1)", lambda v: is_number(v) and 0 <= v < 1),
        Rule("block_end_decay", "a number >= 0", non_negative),
        Rule("grinding_yield", "a number >= 0", non_negative),
        Rule("grinding_patience", "an integer >= 1", positive_int),
        Rule("factors", "four positive numbers", lambda v: are_numbers(v, 4) and all(f > 0 for f in v)),
        Rule(
            "budget_fractions",
            "three numbers in (0, 1]",
            lambda v: are_numbers(v, 3) and all(0 < f <= 1 for f in v),
        ),
        *(
            Rule(name, "True or False", boolean)
            for name in ("adaptive", "block_schedule", "position_factors")
        ),
        choice_rule("grinding_action", GRINDING_ACTIONS),
        Rule("gating", "True, False or None (model default)", lambda v: v is None or isinstance(v, bool)),
    )

    def check(self, labels: dict[str, str]) -> None:
        super().check(labels)
        if self.clip_low > self.clip_high:
            raise InputError(
                f"{self.OWNER}.clip_low ({self.clip_low}) must not exceed {self.OWNER}.clip_high "
                f"({self.clip_high})",
                field=named(labels, f"{self.OWNER}.clip_low")[1],
            )

    def refuse_unread(self, config) -> None:
        dotted = f"{self.OWNER}.threshold"  # cai's, or a composition's that carries its fields
        if dotted in config.given and self.adaptive:
            name = config.labels.get(dotted, "threshold")
            raise InputError(
                f"{name} does not apply to method {config.method!r}: with CAI's adaptive schedule on, its "
                "thresholds follow the schedule; give adaptive=false with it (the CLI: in a --settings "
                "file's cai) "
                "for a fixed threshold, or use method 'fastdllm'",
                field=name,
            )

    def arguments(self, gating: bool) -> dict:
        return dict(s=self, gating=gating, fixed_threshold=self.threshold)


# Every field keeps its flat name of earlier versions (`theta_end=0.6`, a body's "theta_end").
CAISettings.LEGACY = {f.name: f.name for f in fields(CAISettings)}


def block_end_threshold(block_index: int, s: CAISettings) -> float:
    """theta_e(b) for the 0-based block index (b = block_index + 1)."""
    if not s.block_schedule:
        return s.theta_end
    # The floor only limits the decay: an end threshold set below it stays as set.
    return max(s.theta_end - s.block_end_decay * block_index, min(s.block_end_floor, s.theta_end))


def block_threshold(step: int, total_steps: int, block_index: int, s: CAISettings) -> float:
    """theta_b(t): held at theta_s during warm-up, then a cosine down to theta_e(b)."""
    warmup_steps = s.warmup * total_steps
    if step < warmup_steps:
        return s.theta_start
    theta_end = block_end_threshold(block_index, s)
    u = (step - warmup_steps) / (total_steps - warmup_steps)
    return theta_end + (s.theta_start - theta_end) / 2 * (1 + math.cos(math.pi * u))


def quarter_of_block(block_length: int, device=None) -> torch.Tensor:
    """0..3: which quarter of the block each position is in (16/32/48 cuts at 64)."""
    return torch.arange(block_length, device=device) * 4 // block_length


def position_factors(block_length: int, s: CAISettings, device=None) -> torch.Tensor:
    return _factor_table(block_length, tuple(s.factors), str(device) if device is not None else "cpu")


@functools.lru_cache(maxsize=32)
def _factor_table(block_length: int, factors: tuple, device: str) -> torch.Tensor:
    # Built once per (block, factors, device): a fresh host-to-device copy every step would stall the GPU.
    return torch.tensor(factors, device=device)[quarter_of_block(block_length, device)]


def token_thresholds(theta_b: float, block_length: int, s: CAISettings, device=None) -> torch.Tensor:
    """theta_i(t) for each position of the block, shape [block]."""
    if not s.position_factors:
        return torch.full((block_length,), theta_b, device=device)
    return (theta_b * position_factors(block_length, s, device)).clamp(s.clip_low, s.clip_high)


def budget_levels(total_steps: int, s: CAISettings) -> tuple[int, int, int]:
    """Easy / normal / hard budgets in steps (8 / 32 / 64 at T = 64)."""
    return tuple(max(1, int(total_steps * f)) for f in s.budget_fractions)


def budgets(first_confidence: torch.Tensor, total_steps: int, s: CAISettings) -> torch.Tensor:
    """B_i per position, [R, block] (Box 5: cases checked top to bottom)."""
    easy, normal, hard = budget_levels(total_steps, s)
    quarter = quarter_of_block(first_confidence.shape[1], first_confidence.device)
    is_easy = (first_confidence > s.easy_confidence) & (quarter < 2)
    is_hard = (first_confidence < s.hard_confidence) | (quarter == 3)
    levels = torch.full_like(first_confidence, normal, dtype=torch.long)
    levels = levels.masked_fill(is_hard, hard)
    return levels.masked_fill(is_easy, easy)


def select(view: StepView, s: CAISettings, gating: bool, fixed_threshold: float) -> torch.Tensor:
    if s.adaptive:
        theta_b = block_threshold(view.step, view.total_steps, view.block_index, s)
    else:
        theta_b = fixed_threshold
    theta_i = token_thresholds(theta_b, view.block_length, s, view.confidence.device)
    commit = view.masked & (view.confidence >= theta_i)
    if gating:
        commit |= view.masked & (view.step >= budgets(view.first_confidence, view.total_steps, s))
    commit = with_most_confident(commit, view)
    if gating:
        commit = _grinding_fallback(commit, view, s)
    return commit


def _grinding_fallback(commit: torch.Tensor, view: StepView, s: CAISettings) -> torch.Tensor:
    """Count low-yield steps per row; after K in a row, commit every masked
    token with confidence above the fallback threshold and reset the count
    ("continue"), or commit every masked token, which ends the block ("exit")."""
    counter = view.state["low_yield_steps"]
    low_yield = commit.sum(dim=1) < s.grinding_yield
    count = torch.where(low_yield, counter[view.rows] + 1, torch.zeros_like(counter[view.rows]))
    grinding = count >= s.grinding_patience
    counter[view.rows] = count.masked_fill(grinding, 0)
    forced = (
        view.masked if s.grinding_action == "exit" else view.masked & (view.confidence > s.fallback_threshold)
    )
    return commit | (grinding[:, None] & forced)
