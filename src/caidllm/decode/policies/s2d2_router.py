"""S2D2's router (phymhan/S2D2 ``_decide_do_verify``): whether a step verifies the first run of masks of
its block (decode/policies/s2d2.py). ``mask_span_length``: the run is at least ``min_span`` long;
``score_threshold``: E[K] - c (static) or E[K] - c * (masks above the threshold) (dynamic) reaches the
threshold, E[K] = sum_k prod_{i<=k} alpha_i over the run, alpha_i from the draft distributions (the
estimators); ``score_hysteresis``: on above ``hysteresis_on``, off below ``hysteresis_off``, the switch kept
across the request; ``contextual_bandit_ucb``: policies/s2d2_bandit.py.
"""

from __future__ import annotations

import torch

from caidllm.decode.policies.s2d2_bandit import Bandit


def acceptance_estimates(probs: torch.Tensor, s) -> torch.Tensor:
    """[S] alpha_i of the run's draft distributions probs [S, V] (the official estimators)."""
    if s.estimator == "hard_margin_threshold":
        top2 = probs.topk(2, dim=-1).values
        return ((top2[:, 0] - top2[:, 1]) > s.margin_threshold).to(probs.dtype)
    if s.estimator == "soft_entropy_negexp":
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)
        normalised = entropy / torch.log(torch.tensor(float(probs.shape[-1]), dtype=probs.dtype))
        return torch.exp(-s.entropy_temperature * normalised)
    return (probs**2).sum(dim=-1).clamp(0.0, 1.0)


def verify_score(probs: torch.Tensor, n_confident: int, s) -> float:
    """E[K] - c (static) or E[K] - c * n_confident (dynamic)."""
    expected = float(torch.cumprod(acceptance_estimates(probs, s).clamp(0.0, 1.0), dim=0).sum())
    return expected - s.penalty * (n_confident if s.score == "difference_dynamic" else 1)


def decide(probs: torch.Tensor, run: list[int], masked: list[bool], n_confident: int, s, state) -> bool:
    """Whether to verify the run (probs [L, V] the block's draft distributions)."""
    if s.router != "contextual_bandit_ucb":
        return route(probs[run], n_confident, s, state)
    L = len(masked)
    if state.bandit is None:
        buckets = s.ucb_span_bins * s.ucb_progress_bins * s.ucb_entropy_bins
        state.bandit = Bandit(L, state.prompt_length % L, buckets)
    left = [b for b, m in enumerate(masked) if m]
    return state.bandit.choose(s, probs[run], probs[left], len(left))


def route(probs: torch.Tensor, n_confident: int, s, state) -> bool:
    """Whether to verify a run of len(probs) masks (probs [S, V] its draft distributions)."""
    if s.router == "mask_span_length":
        return probs.shape[0] >= s.min_span
    score = verify_score(probs, n_confident, s) if probs.shape[0] else float("-inf")
    if s.router == "score_threshold":
        return not score < s.score_threshold
    # The official loop switches on strictly above hysteresis_on ("in paper it is >=").
    state.on = (not score < s.hysteresis_off) if state.on else score > s.hysteresis_on
    return state.on
