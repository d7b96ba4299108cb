"""ES-dLLM early skipping: which block positions go on through the deeper layers.

Within one denoising step (an EarlySkipping forward, models/modes/es.py), every block position
runs the first group of layers. At the first layer of each later group only
the most important share of the positions still running goes on; the others
skip the rest of the step (nested: a position dropped once stays dropped).
A skipped position keeps what the cache holds for it: its K/V at the layers it
skipped and its final hidden state, which the LM head reads.

The schedule is a list of (keep fraction, group start as a fraction of depth);
the default [(1.0, 0.0), (0.5, 0.125), (0.25, 0.25)] runs all block positions
through layers [0, n/8), the top 50% through [n/8, n/4) and the top 25% through
[n/4, n). Counts are fixed per row (ceil(fraction * block length)) so shapes
stay rectangular in a batch; each row picks its own positions.

Importance at a group boundary, per row, among the positions still running:
    alpha * previous-step confidence + (1 - alpha) * drift / (max drift of the row)
where drift = ||h - h_cached|| / ||h_cached|| compares the position's input to
the boundary layer with the cached input from the last step that ran that
layer on it. Forced keeps (the two most confident masked positions, the
leftmost masked one, and those committed at the previous step) get a bonus
larger than any score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import InputError
from ..setting_rules import CacheSettings, Rule

DEFAULT_SCHEDULE = ((1.0, 0.0), (0.5, 0.125), (0.25, 0.25))
DEFAULT_ALPHA = 0.5
FORCED_BONUS = 2.0  # the alpha mix lies in [0, 1], so any forced keep outranks every other position


def check_schedule(schedule, name: str = "schedule") -> tuple[tuple[float, float], ...]:
    """The schedule as a tuple of (fraction, start) float pairs; InputError naming
    the first bad value otherwise."""
    try:
        pairs = [tuple(p) for p in schedule]
    except TypeError:
        raise InputError(
            f"{name} must be a sequence of (keep_fraction, start) pairs, got {schedule!r}"
        ) from None
    if not pairs:
        raise InputError(f"{name} must have at least one (keep_fraction, start) pair, got {schedule!r}")
    for i, p in enumerate(pairs):
        if len(p) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p):
            raise InputError(f"{name}[{i}] must be a pair of numbers (keep_fraction, start), got {p!r}")
        fraction, start = p
        if not 0 < fraction <= 1:
            raise InputError(f"{name}[{i}] keep fraction must be in (0, 1], got {fraction!r}")
        if not 0 <= start < 1:
            raise InputError(f"{name}[{i}] start must be in [0, 1) (a fraction of the depth), got {start!r}")
    if pairs[0] != (1, 0):
        raise InputError(
            f"{name}[0] must be (1.0, 0.0): every block position runs the first layers; got {pairs[0]!r}"
        )
    for i in range(1, len(pairs)):
        if pairs[i][1] <= pairs[i - 1][1]:
            raise InputError(
                f"{name} starts must increase; {name}[{i}] starts at {pairs[i][1]!r} "
                f"after {pairs[i - 1][1]!r}"
            )
        if pairs[i][0] > pairs[i - 1][0]:
            raise InputError(
                f"{name} keep fractions must not increase (skipped positions never come back); "
                f"{name}[{i}] keeps {pairs[i][0]!r} after {pairs[i - 1][0]!r}"
            )
    return tuple((float(f), float(s)) for f, s in pairs)


def check_alpha(alpha, name: str = "alpha") -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 <= alpha <= 1:
        raise InputError(f"{name} must be in [0, 1], got {alpha!r}")
    return float(alpha)


@dataclass
class EarlySkippingSettings(CacheSettings):
    """Cache mode "es" (the dual cache with ES-dLLM early skipping): (keep fraction, group start as a
    fraction of depth) pairs, and the weight of the previous-step confidence against the hidden-state
    drift in the importance score."""

    schedule: tuple[tuple[float, float], ...] = DEFAULT_SCHEDULE
    alpha: float = DEFAULT_ALPHA

    OWNER: ClassVar[str] = "es"
    TITLE: ClassVar[str] = "ES-dLLM early skipping"
    LEGACY: ClassVar[dict[str, str]] = {"es_schedule": "schedule", "es_alpha": "alpha"}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "schedule",
            "(keep fraction, start) pairs: fractions in (0, 1], starts rising from 0",
            normalise=check_schedule,
        ),
        Rule("alpha", "in [0, 1]", normalise=check_alpha),
    )


def group_start_layers(schedule, n_layers: int) -> list[int]:
    """First layer of each group: start * n_layers rounded half up (28-layer
    Dream: 3.5 -> 4), at least 1 so that layer 0 always runs every position."""
    return [0] + [min(max(math.floor(s * n_layers + 0.5), 1), n_layers) for _, s in schedule[1:]]


def layer_fractions(schedule, n_layers: int) -> list[float]:
    """Keep fraction of each layer, [n_layers]; where two groups round to the
    same first layer, the later one wins."""
    starts = group_start_layers(schedule, n_layers)
    return [[f for (f, _), s in zip(schedule, starts) if s <= layer][-1] for layer in range(n_layers)]


def keep_counts(schedule, n_layers: int, block_length: int) -> list[int]:
    """Block positions that run each layer, [n_layers]."""
    # round(): 0.3 * 10 is 3.0000000000000004, whose ceil would keep one too many.
    return [math.ceil(round(f * block_length, 9)) for f in layer_fractions(schedule, n_layers)]


def hidden_levels(schedule, n_layers: int) -> tuple[int, ...]:
    """The layers whose input an ES cache keeps: each layer where the keep
    fraction drops (the drift is measured there), and n_layers, standing for
    the last layer's output (the final hidden state a skipped position hands
    to the LM head)."""
    fractions = layer_fractions(schedule, n_layers)
    return tuple(layer for layer in range(1, n_layers) if fractions[layer] < fractions[layer - 1]) + (
        n_layers,
    )


def forced_keeps(
    prev_confidence: torch.Tensor, masked: torch.Tensor, just_committed: torch.Tensor
) -> torch.Tensor:
    """[R, block] bool: the two most confident masked positions (by the previous
    step's confidence), the leftmost masked position, and the positions
    committed at the previous step."""
    scores = prev_confidence.float().masked_fill(~masked, float("-inf"))
    top = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :2]
    # rows with < 2 masks pick no unmasked one
    forced = torch.zeros_like(masked).scatter_(1, top, True) & masked
    leftmost = masked.long().argmax(dim=1, keepdim=True)  # first True; 0 when nothing is masked
    forced |= torch.zeros_like(masked).scatter_(1, leftmost, True) & masked
    return forced | just_committed


def relative_drift(x: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """||x - cached|| / ||cached|| over the hidden dimension, in fp32: [R, n]."""
    x, cached = x.float(), cached.float()
    return (x - cached).norm(dim=-1) / cached.norm(dim=-1).clamp_min(1e-12)


def importance(
    prev_confidence: torch.Tensor, drift: torch.Tensor, forced: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Score of each running position, [R, n]: alpha * confidence + (1 - alpha) *
    drift normalised by the row's largest drift, + a bonus for forced keeps."""
    drift = drift / drift.amax(dim=1, keepdim=True).clamp_min(1e-12)
    score = alpha * prev_confidence.float() + (1 - alpha) * drift
    return score + FORCED_BONUS * forced.float()


def choose(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best scores of each row, in ascending index order (ties
    go to the leftmost, so the choice of a row never depends on the others)."""
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    return best.sort(dim=1).values


@dataclass
class EarlySkip:
    """What an EarlySkipping forward (models/modes/es.py) needs besides the canvas: the
    engine's view of the previous step, for the selected rows. After the call
    it also holds the work done, for accounting."""

    prev_confidence: torch.Tensor  # [R, block] confidence of every block position at the previous step
    just_committed: torch.Tensor  # [R, block] bool, committed at the previous step
    masked: torch.Tensor  # [R, block] bool, still a mask token now
    schedule: tuple = DEFAULT_SCHEDULE
    alpha: float = DEFAULT_ALPHA
    # Set by the forward. Pairs count (layer, block position) runs per row (the
    # same for every row); Dream's extra position on the left is not counted.
    computed_pairs: int = 0
    full_pairs: int = 0  # n_layers * block length: what a dual-cache step runs
    kept: torch.Tensor | None = None  # [R, k] block positions that ran the last layer

    def check(self, rows: int, block_length: int) -> None:
        self.schedule = check_schedule(self.schedule)
        self.alpha = check_alpha(self.alpha)
        for name in ("prev_confidence", "just_committed", "masked"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (rows, block_length):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise InputError(
                    f"skip.{name} must be a tensor of shape {(rows, block_length)} "
                    f"(selected rows, block length), got {shape}"
                )
        for name in ("just_committed", "masked"):
            if getattr(self, name).dtype != torch.bool:
                raise InputError(f"skip.{name} must be a bool tensor, got {getattr(self, name).dtype}")
