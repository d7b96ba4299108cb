"""The search of `caidllm calibrate`: which CAI settings are fastest at an accuracy floor.

A seeded coordinate search over a small grid (SEARCH_SPACE; a uniform-state
model's decoder has its own, calibrate_kinds.py). It starts
from the preset's values (the paper's constants for `cai`); each trial
changes one setting of the best point so far to another value of its grid
and decodes every held-out sample with it. The floor is vanilla's accuracy
(a uniform-state model: the official sampler's) on the same samples minus
the allowed loss. A trial replaces the best point
when `better` says so: feasible (accuracy >= floor) beats infeasible, then
the lower cost (mean NFE, or wall seconds) wins; among infeasible points the
more accurate one. The search stops when the budget of decodes is spent or a
whole pass over the settings changes nothing. The settings are visited in
SEARCH_SPACE's order; the seed orders each one's values, so the same seed
gives the same trials.

Pure logic: the decoding is the `evaluate` callable (calibrate_run.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

# name -> values tried, in the order the search visits them (the ones that move NFE most first).
# Small on purpose: one pass is 17 decodes of the held-out set from the paper's constants.
SEARCH_SPACE: dict[str, tuple] = {
    "theta_end": (0.5, 0.6, 0.7, 0.8),
    "warmup": (0.0, 0.15, 0.3),
    "gating": (True, False),
    "grinding_action": ("continue", "exit"),
    "grinding_patience": (2, 3, 4, 6),
    "fallback_threshold": (0.3, 0.4, 0.5),
    "budget_fractions": ((1 / 16, 1 / 4, 1.0), (1 / 8, 1 / 2, 1.0), (1 / 4, 3 / 4, 1.0)),
    "block_end_decay": (0.0, 0.05, 0.1, 0.2),
}
# Settings that act only with confidence gating on (budgets and grinding, Boxes 5 and 7).
GATED = frozenset({"grinding_patience", "grinding_action", "fallback_threshold", "budget_fractions"})
# switch -> the settings that do nothing while it is off (a search space's own: calibrate_kinds.py)
SWITCHES = {"gating": GATED}
OBJECTIVES = ("nfe", "wall")


@dataclass
class Trial:
    label: str  # "vanilla", "start", or "name=value" (the one change from the best point so far)
    values: dict  # the searched settings this trial ran with (vanilla: {})
    accuracy: float  # in [0, 1], mean over tasks of each task's mean score
    nfe: float  # forward passes per request, mean over every held-out request
    wall_s: float  # wall seconds of its decodes (provisional: depends on the machine's load)
    per_task: dict = field(default_factory=dict)  # task -> accuracy
    feasible: bool = False
    kept: bool = False  # became the best point when it ran

    def cost(self, objective: str) -> float:
        return self.nfe if objective == "nfe" else self.wall_s


def floor_of(vanilla_accuracy: float, max_loss_points: float) -> float:
    return vanilla_accuracy - max_loss_points / 100


def better(candidate: Trial, best: Trial, floor: float, objective: str) -> bool:
    """The selection rule: does `candidate` replace `best`?"""
    ok, best_ok = candidate.accuracy >= floor - 1e-12, best.accuracy >= floor - 1e-12
    if ok != best_ok:
        return ok
    if ok:
        return candidate.cost(objective) < best.cost(objective)
    return candidate.accuracy > best.accuracy


def choose(trials: list[Trial], floor: float, objective: str) -> Trial:
    """The best of `trials` by `better` (the earliest wins a tie)."""
    best = trials[0]
    for trial in trials[1:]:
        if better(trial, best, floor, objective):
            best = trial
    return best


def effective(values: dict, switches: dict[str, frozenset] = SWITCHES) -> tuple:
    """What decides a trial's outputs: with a switch off (gating) the settings it gates do nothing."""
    off = set().union(*(gated for switch, gated in switches.items() if values.get(switch, True) is False))
    return tuple(sorted((k, v) for k, v in values.items() if k not in off))


def coordinate_search(
    start: dict,
    evaluate: Callable[[str, dict], Trial],
    budget: int,
    floor: float,
    objective: str = "nfe",
    seed: int = 0,
    on_trial: Callable[[Trial], None] | None = None,
    space: dict[str, tuple] = SEARCH_SPACE,
    switches: dict[str, frozenset] = SWITCHES,
) -> list[Trial]:
    """The trials run, in order (the start first). `budget` counts decodes of the held-out set, start
    included; a candidate equivalent to one already run (`effective`, under `switches`) costs nothing and
    is skipped. `space` and `switches`: the mask-based CAI controller's by default (calibrate_kinds.py
    has the uniform-state decoder's)."""
    rng = random.Random(seed)
    names = [n for n in space if n in start]
    orders = {n: rng.sample(space[n], len(space[n])) for n in names}
    best = evaluate("start", dict(start))
    best.feasible, best.kept = best.accuracy >= floor - 1e-12, True
    trials, seen = [best], {effective(start, switches)}
    if on_trial:
        on_trial(best)
    improved = True
    while improved and len(trials) < budget:
        improved = False
        for name in names:
            for value in orders[name]:
                if len(trials) >= budget:
                    return trials
                values = {**best.values, name: value}
                if effective(values, switches) in seen:
                    continue
                seen.add(effective(values, switches))
                trial = evaluate(f"{name}={_show(value)}", values)
                trial.feasible = trial.accuracy >= floor - 1e-12
                trial.kept = better(trial, best, floor, objective)
                trials.append(trial)
                if on_trial:
                    on_trial(trial)
                if trial.kept:
                    best, improved = trial, True
    return trials


def _show(value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(f"{v:.3g}" for v in value) + ")"
    return str(value)
