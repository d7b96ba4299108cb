"""KLASS: KL-adaptive stability sampling (shkim0116/KLASS, ``src/model/llada_klass.py``,
``stable_confident_decode`` with ``alg="klass"``, ``unmask_strategy="all"``; Kim et al., arXiv 2511.05664).

Each step the block's masked positions whose prediction is both confident (the probability of the best
token strictly above `conf_threshold`) and stable (the KL divergence of the position's distribution from
the previous step's strictly below `kl_threshold` at each of the last `history` steps) are committed,
all of them. A step where no position is ready falls back on LLaDA's linear schedule (n // T of the most
confident, n counted at the block's start; policies/vanilla.py). The official code computes the
probabilities in float64 and the KL as sum p (log(p + 1e-12) - log(q + 1e-12)); so does this one.

Two readings of caidllm's (rows of the deviation table in docs/decoder-fidelity.md): the mask token is
never predicted (its probability is 0 here), and a block's first step has no previous distribution of
its positions (caidllm's forwards predict only the current block), so its KL counts as unstable; the
official code compares with the previous block's last forward there (on the first block with zeros,
which is unstable too: the two agree on every first block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.decode.policies.base import PolicySettings, PolicyState, StepView, rank_by_confidence
from caidllm.decode.policies.vanilla import tokens_at_step
from caidllm.setting_rules import Rule, positive_int

EPSILON = 1e-12  # the official code's, inside both logarithms


def _probability(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


@dataclass
class KlassSettings(PolicySettings):
    """The confidence and KL thresholds and how many steps the KL must stay below its threshold."""

    conf_threshold: float = 0.9
    kl_threshold: float = 0.01
    history: int = 2

    OWNER: ClassVar[str] = "klass"
    TITLE: ClassVar[str] = "KLASS: KL-stable and confident positions (arXiv 2511.05664)"
    LEGACY: ClassVar[dict[str, str]] = {}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("conf_threshold", "in [0, 1)", _probability),
        Rule("kl_threshold", "a number > 0", _positive),
        Rule("history", "an integer >= 1", positive_int),
    )

    def arguments(self, gating: bool) -> dict:
        return dict(conf_threshold=self.conf_threshold, kl_threshold=self.kl_threshold, history=self.history)


class KlassState(PolicyState):
    """The request's previous distribution over its block's positions and its last KLs (one a step)."""

    previous: torch.Tensor | None = None  # [block, V] float64
    kls: list[torch.Tensor]  # each [block] float64, oldest first

    def start_block(self, request) -> None:
        self.previous, self.kls = None, []

    def observe(self, probabilities: torch.Tensor, history: int) -> list[torch.Tensor]:
        """Record this step's distribution [block, V]; the block's last `history` KLs, oldest first."""
        if self.previous is None:
            kl = torch.full(
                probabilities.shape[:1], float("inf"), dtype=torch.float64, device=probabilities.device
            )
        else:
            kl = (probabilities * ((probabilities + EPSILON).log() - (self.previous + EPSILON).log())).sum(-1)
        self.previous, self.kls = probabilities, (self.kls + [kl])[-history:]
        return self.kls


def new_state(config, prompt: list[int]) -> KlassState:
    state = KlassState()
    state.kls = []
    return state


def select(view: StepView, conf_threshold: float, kl_threshold: float, history: int) -> torch.Tensor:
    if view.step == 0:
        view.state["n_masked"][view.rows] = view.masked.sum(dim=1)
    probabilities = view.probabilities  # [R, block, V] float64, the mask token's 0
    stable = torch.zeros_like(view.masked)
    for row, state in enumerate(view.policy_states):
        kls = state.observe(probabilities[row], history)
        if view.step >= history - 1:  # the official gate: too few steps in the block, nothing is stable
            stable[row] = torch.stack(kls).lt(kl_threshold).all(dim=0)
    confident = probabilities.amax(dim=-1) > conf_threshold
    ready = stable & confident & view.masked
    k = tokens_at_step(view.state["n_masked"][view.rows], view.step, view.total_steps)
    scheduled = view.masked & (rank_by_confidence(view) < k[:, None])
    return torch.where(ready.any(dim=1, keepdim=True), ready, scheduled)
