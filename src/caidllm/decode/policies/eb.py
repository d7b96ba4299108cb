"""EB-Sampler: entropy-bounded unmasking (Ben-Hamu et al., "Accelerated Sampling from Masked
Diffusion Models via Entropy Bounded Unmasking", arXiv 2505.24857).

At each step the masked positions of the block are sorted by an error proxy, lowest first,
and the largest prefix U of that order is unmasked whose summed proxy minus its largest
member stays within gamma: sum_{l in U} e_l - max_{l in U} e_l <= gamma (the left side
bounds the mutual information among the unmasked tokens). In sorted order the max is the
last member, so the k-th position joins iff the proxies of the k - 1 before it sum to at
most gamma; the first always joins (every step makes progress).

Proxies: "entropy" (the paper's default, in nats), "confidence" (1 - p of the predicted
token) and "margin" (1 - (p1 - p2)). Readings taken: the paper defines the proxies for
sorting and bounding alike; we use the same value for both. Ties in the order go to the
leftmost position. No official repository of the sampler for LLaDA / Dream is public;
tests/test_decoders.py re-states the rule as a plain loop and compares tokens.
"""

from __future__ import annotations

import torch

from caidllm.decode.policies.base import StepView


def error_proxy(view: StepView, proxy: str) -> torch.Tensor:
    """[R, block] the error proxy of each position (lower = safer to unmask)."""
    if proxy == "entropy":
        return view.entropy
    if proxy == "confidence":
        return 1 - view.confidence
    return 1 - (view.confidence - view.second)  # margin


def select(view: StepView, gamma: float, proxy: str) -> torch.Tensor:
    errors = error_proxy(view, proxy).double().masked_fill(~view.masked, float("inf"))
    ordered, order = torch.sort(errors, dim=1, stable=True)
    before = ordered.cumsum(dim=1) - ordered  # sum of the proxies ranked ahead of each position
    accept_sorted = (before <= gamma) & torch.isfinite(ordered)
    accept_sorted[:, 0] &= view.masked.any(dim=1)
    return torch.zeros_like(view.masked).scatter_(1, order, accept_sorted) & view.masked


