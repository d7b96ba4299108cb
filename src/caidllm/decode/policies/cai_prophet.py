"""CAI-dLLM with Prophet's early exit (`cai-prophet`): CAI's controller (policies/cai.py) commits at every
step until Prophet's watch (policies/prophet.py: the answer's mean top-2 logit gap against the phase's
threshold) says the answer has converged; then every mask left in the generation takes this step's
prediction and the request ends, as under Prophet.

A composition of the two policies' functions, nothing re-stated: the step's commits are `cai.select`'s and
the exit is `prophet.exit_when_converged` over them. The settings are CAI's fields and Prophet's together
(one owner, `cai_prophet`). Prophet's phases read the step as the schedule counts it (the block's index
times T plus the step in the block), CAI's blocks often ending before their T steps. Like Prophet, no cache:
the watch and the fill read the whole generation's logits at every step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from caidllm.decode.policies import cai, prophet
from caidllm.decode.policies.base import StepView
from caidllm.setting_rules import Rule


@dataclass
class CAIProphetSettings(cai.CAISettings, prophet.ProphetSettings):
    """CAI's controller constants (cai.CAISettings) and Prophet's watch (prophet.ProphetSettings)."""

    OWNER: ClassVar[str] = "cai_prophet"
    TITLE: ClassVar[str] = "CAI-dLLM's controller with Prophet's early exit"
    RULES: ClassVar[tuple[Rule, ...]] = cai.CAISettings.RULES + prophet.ProphetSettings.RULES

    def arguments(self, gating: bool) -> dict:
        return dict(
            **cai.CAISettings.arguments(self, gating), **prophet.ProphetSettings.arguments(self, gating)
        )


# CAI's flat names of earlier versions (`theta_end=0.6`) reach this class's CAI fields too.
CAIProphetSettings.LEGACY = {f.name: f.name for f in fields(cai.CAISettings)}


def select(
    view: StepView,
    s: cai.CAISettings,
    gating: bool,
    fixed_threshold: float,
    answer_start: int | None,
    thresholds: tuple[float, float, float],
) -> torch.Tensor:
    commit = cai.select(view, s=s, gating=gating, fixed_threshold=fixed_threshold)
    return prophet.exit_when_converged(view, commit, answer_start, thresholds)
