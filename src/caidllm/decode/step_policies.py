"""Which of a step's forward groups run (the scheduler forms the groups; a step policy picks).

A request's tokens never depend on the choice: every row is computed as it would be alone, and
a group that does not run at a step simply does not advance (batch invariance). What the choice
decides is whose time a step costs.

- "all": every group runs at every step, so one step costs the sum of every group's forward and
  each request advances at the pace of the slowest mix in flight (a 6-forward cached request
  beside long uncached ones waits for their forwards at each of its own steps).
- "fair" (the default): start-time fair queuing over forwards, by measured forward time. Each
  request in flight has a virtual time: the wall time of the forwards it ran in (each row is
  charged its whole forward, what that forward cost its latency, so a batch of rows sharing a
  forward counts as one forward, not as one claim per row). A step runs the group whose
  most-owed member has the least virtual time (every group tied with it too: at the start all
  are, so the first step runs them all). A request taking a slot starts at the virtual time of
  the last group run, so it neither waits for the requests served so far nor overtakes them by
  its arrival. Cheap groups therefore run several times per run of an expensive one, in
  proportion to the cost: a request's time per step is about its own forward times the number
  of forward groups in flight, not the sum of the others' forwards. (Measured against charging each
  row its share, forward / rows, which made a 4-row batch four claims: BENCHMARKS.md.)

  A forward is never interrupted, so a newcomer first waits for the one in progress: a group whose
  rows' last forwards add up to more than SLICE_SECONDS (0.25 s) runs its least recently run rows that fit
  (one at least, the least recently run first, so a round of slices reaches every row) and the others at the
  next steps, which bounds that wait; a slice's time is charged to every row of its group, so the group still
  counts as one forward (a whole round of slices costs each row one forward's time).

  No starvation: a request whose virtual time is the least runs at the next step, and every other
  request's virtual time grows by its service, so between two runs of any request the others are
  served at most about 2 x (requests in flight - 1) x (its forward + the largest forward) seconds
  (the bound of start-time fair queuing; tests/test_step_policies.py checks it). Work is conserved:
  the same rows are computed as under "all" (in another order, and a long forward in parts), so
  the time to finish everything in flight is about the same; a long request's completion moves by
  the work of the short requests served meanwhile, as under "all".
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Protocol

from caidllm.errors import InputError

# A forward longer than this (by its rows' last measured cost) runs part of its rows at a time under
# "fair": about the longest a newcomer waits for the forward in progress. Measured on the CPU, cutting
# cost no throughput (BENCHMARKS.md); on a GPU only forwards this long are cut, compute-bound already.
SLICE_SECONDS = 0.25


class StepPolicy(Protocol):
    name: str

    def choose(self, groups: list) -> list:
        """What runs at this step: some of the groups (ForwardGroups of the scheduler), in their given
        order, or parts of them (a copy with fewer members and `whole` = the group's); at least one
        when `groups` is non-empty."""

    def ran(self, group, seconds: float) -> None:
        """A chosen group's forward took `seconds` (wall time, its results on the host)."""


class AllGroups:
    """Every group at every step (the rule before step policies)."""

    name = "all"

    def choose(self, groups: list) -> list:
        return groups

    def ran(self, group, seconds: float) -> None:
        pass


class FairShare:
    """Start-time fair queuing over the forwards in flight by their measured wall time; a forward
    longer than `slice_seconds` runs part of its rows at a time."""

    name = "fair"

    def __init__(self, slice_seconds: float = SLICE_SECONDS):
        self.slice_seconds = slice_seconds
        self.virtual: dict[str, float] = {}  # request id -> seconds of the forwards it ran in
        self.row_seconds: dict[tuple[str, str], float] = {}  # (request id, mode) -> its last forward / rows
        self.clock = 0.0  # the virtual time of the last group run: where a newcomer starts
        self.runs = 0  # forwards run so far: the turn a row last ran at orders a group's slices
        self.last_run: dict[str, int] = {}  # request id -> the turn of its last forward

    def choose(self, groups: list) -> list:
        live = {r.id for g in groups for r in g.members}
        for request_id in [i for i in self.virtual if i not in live]:  # finished or cancelled
            del self.virtual[request_id]
        for key in [k for k in self.row_seconds if k[0] not in live]:
            del self.row_seconds[key]
        for request_id in [i for i in self.last_run if i not in live]:
            del self.last_run[request_id]
        for request_id in live:
            self.virtual.setdefault(request_id, self.clock)
        if not groups:
            return groups
        tags = [min(self.virtual[r.id] for r in g.members) for g in groups]
        least = min(tags)
        self.clock = max(self.clock, least)
        return [self._slice(g) for g, tag in zip(groups, tags) if tag <= least]

    def ran(self, group, seconds: float) -> None:
        seconds = max(float(seconds), 0.0)
        # A slice is charged to every row of its whole group, so the group's rows still count as one
        # forward when they run a few at a time (a whole round of slices: one forward's time each).
        for r in getattr(group, "whole", None) or group.members:
            self.virtual[r.id] = self.virtual.get(r.id, self.clock) + seconds
        self.runs += 1
        for r in group.members:
            self.row_seconds[(r.id, group.mode)] = seconds / len(group.members)
            self.last_run[r.id] = self.runs

    def _slice(self, group):
        """The group, or when its rows' last measured forwards add up to more than slice_seconds, its
        least recently run rows that fit (one at least), in slot order: a forward in progress is never
        interrupted, so this bounds how long a newcomer waits for one. The rest run at the next steps."""
        members = group.members
        costs = {r.id: self.row_seconds.get((r.id, group.mode), 0.0) for r in members}
        if len(members) == 1 or sum(costs.values()) <= self.slice_seconds:
            return group
        taken, total = set(), 0.0

        # Least recently run first (a round of slices reaches every row: a slice is charged to the whole
        # group, so rows owing differently keep their order and "most owed first" would run one forever);
        # among equals the most owed, then the rows that ran least.
        def order(r):
            return (self.last_run.get(r.id, -1), self.virtual[r.id], getattr(r, "nfe", 0), r.slot)

        for r in sorted(members, key=order):
            if taken and total + costs[r.id] > self.slice_seconds:
                break
            taken.add(r.id)
            total += costs[r.id]
        part = copy.copy(group)
        part.members, part.whole = [r for r in members if r.id in taken], members
        return part


STEP_POLICIES: dict[str, Callable[[], StepPolicy]] = {"fair": FairShare, "all": AllGroups}
DEFAULT_STEP_POLICY = "fair"


def make_step_policy(name) -> StepPolicy:
    """A fresh step policy by name (InputError naming the choices for anything else)."""
    if not isinstance(name, str) or name not in STEP_POLICIES:
        raise InputError(f"unknown step policy {name!r}; choose one of {', '.join(STEP_POLICIES)}")
    return STEP_POLICIES[name]()
