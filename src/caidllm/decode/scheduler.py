"""Which requests run at a step, and together: the queue, admission into free slots of the
Frame, the limits (max_batch in flight, max_queue waiting), cancel and drop, and the grouping
of the requests in flight into the forwards of a step; which of those run at a step is the step
policy's (step_policies.py).

The one place these rules live: Engine.submit and the BackgroundEngine ask `check_room`, and
nothing else reads or writes the queue.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from caidllm.checks import is_int
from caidllm.decode.frame import Frame
from caidllm.decode.request import Request
from caidllm.decode.step_policies import DEFAULT_STEP_POLICY, make_step_policy
from caidllm.errors import EngineFullError, InputError
from caidllm.models.modes import FORWARD_MODES


@dataclass
class ForwardGroup:
    """Requests that share one forward at this step: the same mode and block length (and the
    mode's own key, e.g. the early-skip schedule). Members in slot order."""

    mode: str
    members: list[Request]
    seconds: float = 0.0  # its forward's wall time, once run (the step policy's measure)
    whole: list[Request] | None = None  # a step policy's slice of a larger group: that group's members


def width_class(request: Request) -> int:
    """Rows of canvases of different sizes (prompt and answer, to a power of two) never share a forward:
    a forward computes every row over the columns of its widest, so a 64-token request batched with
    512-token ones would pay their width at each of its steps (a light no-cache request beside heavy
    ones was 10x slower than alone: issue 49). Rows of a size class batch as before."""
    return (len(request.prompt) + request.layout.span - 1).bit_length()


class Limits:
    """The queue and the requests in flight, with the limits that govern both: what a BackgroundEngine
    asks of any engine's scheduler (this one's, and the uniform-state engine's)."""

    def __init__(self, max_batch: int, max_queue: int):
        for name, value, low in (("max_batch", max_batch, 1), ("max_queue", max_queue, 0)):
            if not is_int(value) or value < low:
                raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
        self.max_batch, self.max_queue = max_batch, max_queue
        self.queue: deque = deque()
        self.running: OrderedDict = OrderedDict()  # in admission order

    @property
    def capacity(self) -> int:
        """Requests the engine holds at most: max_batch in flight and max_queue waiting."""
        return self.max_batch + self.max_queue

    def check_room(self, request_id: str, known: bool, held: int) -> None:
        """Refuse a request whose id is `known` already, or one more when `held` requests are
        already held (the engine's own count, or a BackgroundEngine's including its inbox)."""
        if known:
            raise InputError(f"request id {request_id!r} is already in the engine")
        if held >= self.capacity:
            raise EngineFullError(
                f"the engine is full: {held} requests in flight or queued "
                f"(max_batch {self.max_batch}, max_queue {self.max_queue})"
            )

    def add_checked(self, requests: Iterable) -> None:
        """Queue requests whose room was checked already (a BackgroundEngine's inbox)."""
        self.queue.extend(requests)

    def holds(self, request_id: str) -> bool:
        return request_id in self.running or any(r.id == request_id for r in self.queue)

    @property
    def held(self) -> int:
        return len(self.running) + len(self.queue)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self.queue)

    @property
    def in_flight(self) -> int:
        """Requests in a slot, decoding."""
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.queue)


class Scheduler(Limits):
    """The queue and the requests in flight, with the limits that govern both.

    on_admit(request, slot) is called when a queued request takes a slot (the engine starts its
    bookkeeping there). step_policy: which groups run at a step (step_policies.py)."""

    def __init__(
        self,
        lm,
        max_batch: int,
        max_queue: int,
        on_admit: Callable[[Request, int], None],
        step_policy: str = DEFAULT_STEP_POLICY,
    ):
        super().__init__(max_batch, max_queue)
        self.step_policy = make_step_policy(step_policy)
        self.lm = lm
        self.frame = Frame(lm, max_batch)
        self.finished_ids: deque[str] = deque(maxlen=4096)  # for a clear error on a late cancel
        self._on_admit = on_admit

    # ---- requests in and out -----------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a checked request after checking its id and the room left."""
        self.check_room(request.id, self.holds(request.id), self.held)
        self.queue.append(request)

    def cancel(self, request_id: str) -> None:
        """Remove a queued or in-flight request now (between steps) and free its slot."""
        for r in self.queue:
            if r.id == request_id:
                self.queue.remove(r)
                return
        r = self.running.pop(request_id, None)
        if r is None:
            state = "already finished" if request_id in self.finished_ids else "unknown"
            raise InputError(f"cannot cancel request {request_id!r}: {state}")
        self.frame.release(r.slot)
        self.finished_ids.append(request_id)

    def retire(self, request: Request) -> None:
        """A finished request leaves its slot."""
        self.running.pop(request.id)
        self.frame.release(request.slot)
        self.finished_ids.append(request.id)

    def drop_running(self) -> list[str]:
        """Drop every in-flight request and start a fresh Frame; their ids. Queued requests stay."""
        ids = list(self.running)
        self.running.clear()
        self.frame = Frame(self.lm, self.max_batch)
        self.finished_ids.extend(ids)
        return ids

    def cancel_all(self) -> list[str]:
        """Drop every queued and in-flight request (shutdown); their ids."""
        ids = [r.id for r in self.queue]
        self.queue.clear()
        self.finished_ids.extend(ids)
        return ids + self.drop_running()

    # ---- one step -------------------------------------------------------------------------

    def schedule(self) -> list[ForwardGroup]:
        """Admit waiting requests into free slots, group every request in flight into forwards,
        and return the groups the step policy runs at this step."""
        self._admit()
        return self.step_policy.choose(self.groups())

    def groups(self) -> list[ForwardGroup]:
        """Every request in flight in the forward it would share at this step."""
        groups: dict[tuple, list[Request]] = {}
        for r in self.running.values():
            # The policy's own forward (WINO's verify) at every step, else the cache mode's choice.
            mode = r.config.policy_spec.forward or r.cache_mode.forward_mode(r)
            # Rows whose forwards may end early (SlowFast's fast phase) share them only with each other.
            shortens = r.config.policy_settings.horizon() is not None
            # Rows whose forwards are partly token-causal (S2D2's AR-like caching) too.
            causal = r.config.policy_settings.causal_span() is not None
            # Rows that see the whole generation share a forward with rows of the same span and block only.
            sees = (r.layout.span, r.block) if r.config.policy_spec.sees_generation else None
            key = (
                mode,
                r.config.block_length,
                FORWARD_MODES[mode].group_key(r),
                r.cache_mode.fold(r),
                shortens,
                causal,
                width_class(r),
                sees,
            )
            groups.setdefault(key, []).append(r)
        return [
            ForwardGroup(key[0], sorted(members, key=lambda r: r.slot)) for key, members in groups.items()
        ]

    def ran(self, groups: list[ForwardGroup]) -> None:
        """The step's groups ran (their `seconds` measured): the step policy's accounts."""
        for group in groups:
            self.step_policy.ran(group, group.seconds)

    def _admit(self) -> None:
        for slot in self.frame.free_slots():
            if not self.queue:
                return
            r = self.queue.popleft()
            cache = r.cache_mode
            self.frame.place(
                slot, r.prompt, r.layout.span, cached=cache.uses_cache, **cache.frame_options(r.config)
            )
            r.slot, r.admitted_at = slot, time.perf_counter()
            self._on_admit(r, slot)
            self.running[r.id] = r
