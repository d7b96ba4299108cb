"""LocalLeap: local determinism propagation around high-confidence anchors ("Accelerating Diffusion LLM
Inference via Local Determinism Propagation", arXiv 2510.07081; friedrichor/LocalLeap, its LLaDA
``generate.py``: ``get_transfer_index`` with ``threshold`` and ``relaxed_threshold``).

Fast-dLLM's threshold rule (the most confident masked position always, every other one whose confidence
reaches `threshold`), plus the leap: the block's masked positions at or above `threshold` this step are
anchors, and every masked position within `radius` of an anchor needs only `relaxed_threshold`. One pass
per step: a position committed through the relaxed threshold is not an anchor itself. With
`relaxed_threshold` None it is Fast-dLLM's rule (the official code's too). No cache, as its official loop.

Defaults: the official example's (threshold 0.9, relaxed 0.75, radius 4, at block 32). The official
repository was not in the stored copies; the rule is re-stated from a public mirror of its LLaDA
``generate.py`` (docs/decoder-fidelity.md names it) and checked in tests/localleap_reference.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.decode.policies.base import PolicySettings, StepView, with_most_confident
from caidllm.errors import InputError
from caidllm.setting_rules import UNIT_INTERVAL, Rule, named, non_negative_int, unit_interval


@dataclass
class LocalLeapSettings(PolicySettings):
    """The anchor threshold, the relaxed threshold near an anchor (None: no leap) and the neighbourhood."""

    threshold: float = 0.9
    relaxed_threshold: float | None = 0.75
    radius: int = 4

    OWNER: ClassVar[str] = "localleap"
    TITLE: ClassVar[str] = "LocalLeap: a relaxed threshold around high-confidence anchors (arXiv 2510.07081)"
    LEGACY: ClassVar[dict[str, str]] = {"threshold": "threshold"}  # the flat name every threshold rule reads
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("threshold", UNIT_INTERVAL, unit_interval),
        Rule("relaxed_threshold", f"{UNIT_INTERVAL} or null", lambda v: v is None or unit_interval(v)),
        Rule("radius", "an integer >= 0", non_negative_int),
    )

    def check(self, labels: dict[str, str]) -> None:
        super().check(labels)
        if self.relaxed_threshold is not None and self.relaxed_threshold > self.threshold:
            # The official code takes it, but then the neighbourhood is stricter: the method's name inverted.
            # The error is about the one of the two the caller gave (the relaxed one when both or neither).
            pair = [f"{self.OWNER}.relaxed_threshold", f"{self.OWNER}.threshold"]
            about = next((name for name in pair if name in labels), pair[0])
            relaxed, anchor = (named(labels, name)[0] for name in pair)
            raise InputError(
                f"{relaxed} ({self.relaxed_threshold}) must not exceed {anchor} ({self.threshold})",
                field=named(labels, about)[1],
            )

    def arguments(self, gating: bool) -> dict:
        return dict(threshold=self.threshold, relaxed=self.relaxed_threshold, radius=self.radius)


def near(anchors: torch.Tensor, radius: int) -> torch.Tensor:
    """[R, block] bool: the positions within `radius` of an anchor (anchors included)."""
    block = anchors.shape[1]
    counts = torch.nn.functional.pad(anchors.long().cumsum(dim=1), (1, 0))  # counts[:, i]: anchors before i
    positions = torch.arange(block, device=anchors.device)
    upper = (positions + radius + 1).clamp(max=block)
    lower = (positions - radius).clamp(min=0)
    return (counts[:, upper] - counts[:, lower]) > 0


def select(view: StepView, threshold: float, relaxed: float | None, radius: int) -> torch.Tensor:
    anchors = view.masked & (view.confidence >= threshold)
    if relaxed is None:
        bar = torch.full_like(view.confidence, threshold)
    else:
        bar = torch.where(near(anchors, radius), relaxed, threshold).to(view.confidence.dtype)
    return with_most_confident(view.masked & (view.confidence >= bar), view)
