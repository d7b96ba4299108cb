"""SlowFast Sampling (Wei et al., "Accelerating Diffusion Large Language Models with
SlowFast Sampling: The Three Golden Principles", arXiv 2506.10848; official code
LiangrunFlora/Slow-Fast-Sampling, sampling_utils/generate_slow_fast_sampling.py).

A block is decoded in sub-cycles, each over a span [last, cur) of the block:
- exploratory (slow) phase, `sf_explore_steps` steps: the span's end is estimated as the
  farthest masked position from `last` on whose confidence reaches `sf_cycle_threshold`
  (certainty principle; one position past `last` when none does), and the estimates of
  the last `sf_window` steps fix it once their standard deviation is below `sf_std`
  (convergence principle; else their mean, fixed at the phase's last step). Each step
  commits every masked position from `last` on with confidence >= `sf_high` when there
  are at least two, else the most confident one there.
- accelerated (fast) phase, until the span is filled: the same rule inside [last, cur)
  only (positional principle). Then `last = cur` and the next sub-cycle starts.

The official fast phase runs its first forward on the whole canvas and every later one on the
canvas up to the span's end only (`model(x[:, :prompt_length + end])`; the suffix's logits are the
first one's, never read there): `sf_shortened` (the `slowfast` preset) does the same, hiding each
row's keys from the span's end on (`horizon` below, models/layers.Context.key_end); the `slowfast-whole`
preset runs every forward on the whole canvas (caidllm's earlier reading). The official keeps running
exploratory forwards after the block is full; the engine ends the block at once (same tokens, fewer
forwards). The mask token is never predicted (engine-wide rule). tests/test_decoders.py re-states the
official loop with the shortened forwards as a switch and compares tokens both ways.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch

from caidllm.checks import is_number
from caidllm.decode.policies.base import PolicySettings, StepView, masked_confidence
from caidllm.errors import InputError
from caidllm.setting_rules import UNIT_INTERVAL, Rule, boolean, named, positive_int, unit_interval

NOWHERE = 1 << 40  # past any canvas: the runner clamps it to the canvas's end
STATE = ("sf_k", "sf_count", "sf_fixed", "sf_cur", "sf_last", "sf_fast")


@dataclass
class SlowFastSettings(PolicySettings):
    """Exploratory steps per sub-cycle, the certainty threshold that marks the cycle's reach, the
    convergence window and its std bound, the accelerated phase's high-confidence threshold, and
    whether the fast phase's forwards end at the span's end (the official code's)."""

    explore_steps: int = 6
    cycle_threshold: float = 0.3
    window: int = 2
    std: float = 1.0
    high: float = 0.9
    shortened: bool = True

    OWNER: ClassVar[str] = "slowfast"
    TITLE: ClassVar[str] = "SlowFast Sampling (arXiv 2506.10848)"
    LEGACY: ClassVar[dict[str, str]] = {
        f"sf_{name}": name
        for name in ("explore_steps", "cycle_threshold", "window", "std", "high", "shortened")
    }
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("explore_steps", "a positive integer", positive_int),
        Rule("window", "a positive integer", positive_int),
        Rule("std", "a positive number", lambda v: is_number(v) and v > 0),
        Rule("shortened", "True or False", boolean),
        Rule("cycle_threshold", UNIT_INTERVAL, unit_interval),
        Rule("high", UNIT_INTERVAL, unit_interval),
    )

    def check_with(self, config) -> None:
        if self.window > config.block_length:
            name, field = named(config.labels, "slowfast.window")
            raise InputError(
                f"{name} ({self.window}) is longer than the block ({config.block_length})", field=field
            )

    def arguments(self, gating: bool) -> dict:
        return dict(
            explore_steps=self.explore_steps,
            cycle_threshold=self.cycle_threshold,
            window=self.window,
            std_bound=self.std,
            high=self.high,
        )

    def state_names(self) -> tuple[str, ...]:
        return state_names(self.window)

    def horizon(self):
        return partial(horizon, explore_steps=self.explore_steps) if self.shortened else None


def state_names(window: int) -> tuple[str, ...]:
    return STATE + tuple(f"sf_hist{i}" for i in range(window))


def _fill(conf: torch.Tensor, span: torch.Tensor, high: float) -> torch.Tensor:
    """At least two confident masked positions in the span: all of them; else the most confident one."""
    candidates = conf.masked_fill(~span, float("-inf"))
    confident = candidates >= high
    best = torch.zeros_like(span).scatter_(1, candidates.argmax(dim=1, keepdim=True), True)
    best &= torch.isfinite(candidates).any(dim=1, keepdim=True)
    return torch.where(confident.sum(dim=1, keepdim=True) > 1, confident, best)


def select(
    view: StepView, explore_steps: int, cycle_threshold: float, window: int, std_bound: float, high: float
) -> torch.Tensor:
    s, rows, bl = view.state, view.rows, view.block_length
    if view.step == 0:  # a new block: one sub-cycle spanning the block, nothing fixed yet
        for name in state_names(window):
            s[name][rows] = 0
        s["sf_cur"][rows] = bl
    k, count, fixed = s["sf_k"][rows], s["sf_count"][rows], s["sf_fixed"][rows].bool()
    cur, last = s["sf_cur"][rows], s["sf_last"][rows]
    hist = torch.stack([s[f"sf_hist{i}"][rows] for i in range(window)], dim=1)
    conf = masked_confidence(view)
    pos = torch.arange(bl, device=conf.device)[None]

    # A fast phase whose span is filled ends the sub-cycle: this step starts the next one.
    span = (pos >= last[:, None]) & (pos < cur[:, None])
    done = (k >= explore_steps) & ~(span & view.masked).any(dim=1)
    last = torch.where(done, cur, last)
    k, count = k.masked_fill(done, 0), count.masked_fill(done, 0)
    fixed = fixed & ~done
    exploring = k < explore_steps

    # Exploratory step: estimate the span's end from `last` on and push it into the window.
    scope, estimate = _estimate(conf, pos, last, cycle_threshold, bl)
    push = exploring & ~fixed
    hist = torch.where(push[:, None], torch.cat([hist[:, 1:], estimate[:, None]], dim=1), hist)
    count = torch.where(push, (count + 1).clamp(max=window), count)
    full = push & (count >= window)
    mean = hist.double().mean(dim=1)
    stable = hist.double().std(dim=1, unbiased=False) < std_bound
    mean_length = mean.floor().long().clamp(1, bl)
    cur = torch.where(full & stable, estimate, torch.where(full, mean_length, cur))
    fixed = torch.where(full, stable | (k == explore_steps - 1), fixed)
    k = torch.where(exploring, k + 1, k)
    # After the last exploratory step an unfixed span takes the mean of what was seen.
    fallback = exploring & (k == explore_steps) & ~fixed
    cur = torch.where(fallback, _seen_length(hist, count, bl), cur)
    fixed = fixed | fallback

    fast_span = (pos >= last[:, None]) & (pos < cur[:, None])
    commit_span = torch.where(exploring[:, None], scope, fast_span)
    commit = _fill(conf, commit_span & view.masked, high)
    # fast forwards of the sub-cycle
    fast = torch.where(exploring, torch.zeros_like(k), s["sf_fast"][rows] + 1)

    _save(
        s, rows, hist, sf_k=k, sf_count=count, sf_fixed=fixed.long(), sf_cur=cur, sf_last=last, sf_fast=fast
    )
    return commit


def _estimate(conf: torch.Tensor, pos: torch.Tensor, last: torch.Tensor, cycle_threshold: float, bl: int):
    """The exploratory step's scope (the positions from `last` on) and its estimate of the span's end:
    past the farthest position confident over cycle_threshold (one position when none is)."""
    scope = pos >= last[:, None]
    reach = scope & (conf >= cycle_threshold)
    farthest = torch.where(reach, pos, -1).amax(dim=1)
    increment = torch.where(reach.any(dim=1), farthest - last + 1, torch.ones_like(last))
    increment = torch.where(last < bl, increment, torch.zeros_like(last))
    return scope, (last + increment).clamp(1, bl)


def _seen_length(hist: torch.Tensor, count: torch.Tensor, bl: int) -> torch.Tensor:
    """The floor of the mean of the window's last `count` estimates; half the block with none."""
    window = hist.shape[1]
    valid = torch.arange(window, device=hist.device)[None] >= (window - count)[:, None]
    seen_mean = (hist.double() * valid).sum(dim=1) / count.clamp(min=1)
    return torch.where(count > 0, seen_mean.floor().long().clamp(1, bl), torch.full_like(count, bl // 2))


def _save(s: dict, rows, hist: torch.Tensor, **values: torch.Tensor) -> None:
    """The rows' state back into the step's state tensors, the window's estimates one tensor each."""
    for name, value in values.items():
        s[name][rows] = value
    for i in range(hist.shape[1]):
        s[f"sf_hist{i}"][rows] = hist[:, i]


def horizon(state: dict[str, torch.Tensor], masked: torch.Tensor, explore_steps: int) -> torch.Tensor:
    """[1] long: where this step's forward may end in the row's block (NOWHERE: it does not end early).
    A fast-phase forward after the sub-cycle's first, its span still masked, ends at the span's end."""
    k, fast, cur, last = state["sf_k"], state["sf_fast"], state["sf_cur"], state["sf_last"]
    pos = torch.arange(masked.shape[-1], device=masked.device)
    open_span = ((pos >= last) & (pos < cur) & masked).any().reshape(1)
    shortened = (k >= explore_steps) & (fast >= 1) & open_span
    return torch.where(shortened, cur, torch.full_like(cur, NOWHERE))
