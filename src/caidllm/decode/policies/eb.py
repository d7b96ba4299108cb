"""EB-Sampler: entropy-bounded unmasking (Ben-Hamu et al., "Accelerated Sampling from Masked
Diffusion Models via Entropy Bounded Unmasking", arXiv 2505.24857).

Algorithm 1 of the paper (EB-Sampler), its selection line: sort the masked positions by the error
proxy, lowest first, and unmask the largest prefix U of that order with
    sum_{l in U} H(p_l) - max_{l in U} H(p_l) <= gamma,
H the entropy of the position's predictive distribution (nats): the bound is always on the summed
entropies (an upper bound of the mutual information among the unmasked tokens); the proxy only
orders the positions. The left side grows with every member added, so the prefix is every k
whose first k members pass; the first always passes (every step makes progress), and gamma = 0
unmasks one position per step (more only where further entropies are exactly 0).
Cross-check: diffusers' EntropyBoundScheduler (v0.39.0, schedulers/scheduling_entropy_bound.py)
accepts "the k lowest-entropy positions such that sum_i^k entropy_i - max(entropy_1..k) <= entropy_bound".

Proxies (the order): "entropy" (the paper's default), "confidence" (1 - p of the predicted
token) and "margin" (1 - (p1 - p2)). Ties go to the leftmost position. No official repository
of the sampler for LLaDA / Dream is public; tests/test_decoders.py re-states Algorithm 1 as a
plain loop for the three proxies and compares tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.decode.policies.base import PolicySettings, StepView
from caidllm.setting_rules import Rule, choice_rule, non_negative

PROXIES = ("entropy", "confidence", "margin")


@dataclass
class EBSettings(PolicySettings):
    """The error budget gamma of a step and the error proxy that orders the positions."""

    gamma: float = 0.01
    proxy: str = "entropy"

    OWNER: ClassVar[str] = "eb"
    TITLE: ClassVar[str] = "EB-Sampler (arXiv 2505.24857)"
    LEGACY: ClassVar[dict[str, str]] = {"eb_gamma": "gamma", "eb_proxy": "proxy"}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("gamma", "a number >= 0 (0: one position per step)", non_negative),
        choice_rule("proxy", PROXIES),
    )

    def arguments(self, gating: bool) -> dict:
        return dict(gamma=self.gamma, proxy=self.proxy)


def error_proxy(view: StepView, proxy: str) -> torch.Tensor:
    """[R, block] the error proxy of each position (lower = unmasked first)."""
    if proxy == "entropy":
        return view.entropy
    if proxy == "confidence":
        return 1 - view.confidence
    return 1 - (view.confidence - view.second)  # margin


def select(view: StepView, gamma: float, proxy: str) -> torch.Tensor:
    order_by = error_proxy(view, proxy).double().masked_fill(~view.masked, float("inf"))
    order = torch.sort(order_by, dim=1, stable=True).indices
    entropy = view.entropy.double().gather(1, order)
    in_order = view.masked.gather(1, order)
    entropy = entropy.masked_fill(~in_order, 0.0)
    # sum - max of the entropies of each prefix of the order (masked positions come first)
    excess = entropy.cumsum(dim=1) - entropy.cummax(dim=1).values
    accept = (excess <= gamma) & in_order
    return torch.zeros_like(view.masked).scatter_(1, order, accept) & view.masked
