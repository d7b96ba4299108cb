"""Prophet: early commit once the answer has converged (pixeli99/Prophet, ``generate_earlyexit.py``,
``generate`` with ``analyze_gap=True``; "Diffusion Language Models Know the Answer Before Decoding").

LLaDA's loop (the linear per-block schedule of policies/vanilla.py, no cache) watched at every step, before
its commit: the mean gap between the two largest logits over 5 answer positions of the generation (from
`answer_start`, cut at its end), against a threshold that falls as the decoding advances (the share of all
steps done, counted from 1: `early` below 0.33, `mid` below 0.67, `late` after). Once the gap reaches it,
every mask left in the whole generation takes its prediction of this step and decoding stops.

The forward returns the whole generation's logits for it (PolicySpec.sees_generation); the policy says
which rows finish (view.finish) and the engine fills them. `answer_start` counts from the generation's start
(a negative one from its end: -28 is the official example's 100 of 128); None: never exits (the official
without an answer position). The mask token is never predicted (caidllm's reading: its logit is left out
of the gap and of the fill; the official includes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.checks import is_int
from caidllm.decode.policies.base import PolicySettings, StepView
from caidllm.decode.policies.vanilla import select as linear_schedule
from caidllm.errors import InputError
from caidllm.setting_rules import Rule, non_negative

ANSWER_LENGTH = 5  # the official generate's, fixed (its caller's answer_length is not passed on)
PHASES = (0.33, 0.67)  # the shares of all steps where the early and mid thresholds end


@dataclass
class ProphetSettings(PolicySettings):
    """Where the answer is watched and the logit gaps that end the decoding, by phase."""

    answer_start: int | None = None
    early: float = 7.5
    mid: float = 5.0
    late: float = 2.5

    OWNER: ClassVar[str] = "prophet"
    TITLE: ClassVar[str] = "Prophet: early commit once the answer's top-2 logit gap is wide"
    LEGACY: ClassVar[dict[str, str]] = {}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "answer_start",
            "an integer (from the generation's end when negative) or null",
            lambda v: v is None or is_int(v),
        ),
        Rule("early", "a number >= 0", non_negative),
        Rule("mid", "a number >= 0", non_negative),
        Rule("late", "a number >= 0", non_negative),
    )

    def check_with(self, config) -> None:
        if config.cache != "none":  # its watch reads the whole generation's logits: every position computed
            raise InputError(
                f"policy {config.policy!r} runs without a cache (Prophet's official loop's), got cache "
                f"{config.cache!r}",
                field="cache",
            )

    def arguments(self, gating: bool) -> dict:
        return dict(answer_start=self.answer_start, thresholds=(self.early, self.mid, self.late))


def answer_gap(logits: torch.Tensor, answer_start: int) -> torch.Tensor | None:
    """[R] the mean top-2 logit gap over the answer positions of `logits` [R, span, V] (None: none inside)."""
    span = logits.shape[1]
    start = answer_start if answer_start >= 0 else span + answer_start
    answer = logits[:, max(start, 0) : min(start + ANSWER_LENGTH, span)].float()
    if answer.shape[1] == 0 or start < 0:
        return None
    top2 = answer.topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).mean(dim=1)


def threshold_at(global_step: int, max_steps: int, thresholds: tuple[float, float, float]) -> float:
    progress = global_step / max_steps
    return thresholds[0] if progress < PHASES[0] else thresholds[1] if progress < PHASES[1] else thresholds[2]


def select(view: StepView, answer_start: int | None, thresholds: tuple[float, float, float]) -> torch.Tensor:
    return exit_when_converged(view, linear_schedule(view), answer_start, thresholds)


def exit_when_converged(
    view: StepView, commit: torch.Tensor, answer_start: int | None, thresholds: tuple[float, float, float]
) -> torch.Tensor:
    """Prophet's early exit over any schedule's `commit`: the rows whose answer gap reaches the phase's
    threshold finish (view.finish) and commit every mask of their block; the others keep `commit`."""
    if answer_start is None:
        return commit
    logits = view.generation_logits  # [R, span, V], the mask token's logit at -inf
    gap = answer_gap(logits, answer_start)
    if gap is None:
        return commit
    max_steps = view.total_steps * (logits.shape[1] // view.block_length)
    global_step = view.block_index * view.total_steps + view.step + 1  # the official counts from 1
    view.finish = gap >= threshold_at(global_step, max_steps, thresholds)
    return torch.where(view.finish[:, None], view.masked, commit)
