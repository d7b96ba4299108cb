"""S2D2's contextual bandit router (phymhan/S2D2 SDAR/generate_ssd_policy.py, ``contextual_bandit_ucb``).

Each verify decision falls in a bucket of three binned context features: the run's length (1 .. block
length), the block's progress (tokens decoded in this block so far / block length; a first block's prompt
tokens do not count) and the mean normalised entropy of the draft distributions (of the run, or of every
mask of the block). Per bucket and action (0: no verify, 1: verify), UCB1: mean reward + beta *
sqrt(ln t / n), an untried action scoring infinity, verify winning ties; the reward of a step is the tokens
it committed / its forwards (2 when it verified). The counts are the request's own (its policy state), so
a request's decisions never depend on its batch, as the official loop's are its generation's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def bin_index(value: float, vmin: float, vmax: float, bins: int) -> int:
    """The official _linear_bin_idx: equal-width bins over [vmin, vmax], the value clamped into it."""
    if bins <= 1 or vmax <= vmin:
        return 0
    ratio = (min(max(value, vmin), vmax) - vmin) / (vmax - vmin)
    return min(bins - 1, max(0, int(ratio * bins)))


def mean_normalised_entropy(probs: torch.Tensor) -> float:
    """Mean over rows of probs [N, V] of entropy / ln V (0 when there is nothing to average)."""
    if probs.numel() == 0 or probs.shape[-1] <= 1:
        return 0.0
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)
    return float((entropy / torch.log(torch.tensor(float(probs.shape[-1]), dtype=probs.dtype))).mean())


@dataclass
class Bandit:
    """One request's UCB counts and rewards, and what it needs to place a step in its bucket."""

    block_length: int
    prompt_tail: int  # prompt tokens in the first decoded block (the official count starts after them)
    buckets: int
    count: list = field(default_factory=list)  # [action][bucket]
    reward_sum: list = field(default_factory=list)
    decisions: int = 0
    committed: int = 0  # tokens the request has committed so far
    pending: tuple[int, int] | None = None  # (action, bucket) awaiting its reward

    def __post_init__(self):
        self.count = [[0] * self.buckets for _ in range(2)]
        self.reward_sum = [[0.0] * self.buckets for _ in range(2)]

    def bucket(self, s, run_probs: torch.Tensor, masked_probs: torch.Tensor, masks_left: int) -> int:
        first = self.committed < self.block_length - self.prompt_tail
        decoded = self.block_length - masks_left - (self.prompt_tail if first else 0)
        progress = min(1.0, max(0.0, decoded / max(1, self.block_length)))
        entropy = mean_normalised_entropy(run_probs if s.ucb_entropy_source == "span" else masked_probs)
        span = bin_index(
            float(max(1, run_probs.shape[0])), 1.0, float(max(1, self.block_length)), s.ucb_span_bins
        )
        step = bin_index(progress, 0.0, 1.0, s.ucb_progress_bins)
        return (span * s.ucb_progress_bins + step) * s.ucb_entropy_bins + bin_index(
            entropy, 0.0, 1.0, s.ucb_entropy_bins
        )

    def choose(self, s, run_probs: torch.Tensor, masked_probs: torch.Tensor, masks_left: int) -> bool:
        """Whether to verify (UCB1 over the bucket's two actions); the choice waits for its reward."""
        self.decisions += 1
        bucket = self.bucket(s, run_probs, masked_probs, masks_left)
        log_t = math.log(max(1, self.decisions))
        scores = []
        for action in (0, 1):
            n = self.count[action][bucket]
            if n == 0:
                scores.append(float("inf"))
                continue
            bonus = 0.0 if log_t <= 0.0 else s.ucb_beta * math.sqrt(log_t / n)
            scores.append(self.reward_sum[action][bucket] / n + bonus)
        action = 1 if scores[1] >= scores[0] else 0
        self.pending = (action, bucket)
        return action == 1

    def reward(self, committed: int, verified: bool) -> None:
        """Credit the pending choice with this step's tokens per forward."""
        self.committed += committed
        if self.pending is not None:
            action, bucket = self.pending
            self.count[action][bucket] += 1
            self.reward_sum[action][bucket] += committed / (2.0 if verified else 1.0)
            self.pending = None
