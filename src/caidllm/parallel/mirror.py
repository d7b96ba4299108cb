"""Every rank runs the same engine steps: rank 0 owns the engines (their scheduler, the HTTP
server) and, before each step, broadcasts what changed since the last one: an engine made or
freed, the requests newly queued (prompt, checked config, id, the state of their random
generators), the cancels; then "step". The other ranks replay those inputs on engines of
their own and step them: since every rank holds the same logits (the head is replicated),
each scheduler and policy decides exactly as rank 0's, and each forward's collectives meet.
After each step rank 0 sends a digest of what it committed; a rank that committed anything else
stops the group with a RankFailure (a safety net: it would mean the ranks' logits differ).

The messages travel on the group's host-side gloo group (mesh.TPGroup.control), pickled
(torch.distributed.broadcast_object_list); a dead peer ends the wait with a RankFailure. That
group's waits are bounded by --tp-timeout: while rank 0 has nothing to send (an idle server, a
command between steps) a keep-alive thread sends an empty message every quarter of it, so a rank
that hears nothing for --tp-timeout knows rank 0 is gone or stopped and leaves."""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
import zlib

import torch.distributed as dist

from ..decode.engine import Engine
from ..errors import RankFailure
from .mesh import TPGroup, first_line
from .watchdog import trace


class RanksDiverged(RuntimeError):
    """A rank's step committed other tokens than rank 0's (reported to rank 0 like any failure)."""


def broadcast(tp: TPGroup, ops: list | None) -> list:
    """Rank 0's `ops` on every rank."""
    box = [ops]
    try:
        dist.broadcast_object_list(box, group=tp.control, group_src=0)
    except Exception as error:  # noqa: BLE001 - gloo raises RuntimeError / DistBackendError
        peer = (
            "a peer rank is gone" if tp.rank == 0 else "rank 0 is gone, or sent nothing within --tp-timeout"
        )
        raise RankFailure(f"tensor-parallel rank {tp.rank}/{tp.size}: {peer} ({first_line(error)})") from None
    return box[0]


class Mirror:
    """Rank 0's side, attached as ``lm.mirror``: every Engine made over the sharded model
    reports to it (decode/engine.py), and it sends the other ranks their inputs each step."""

    def __init__(self, tp: TPGroup, timeout_s: float = 120.0):
        self.tp = tp
        self._pending: list[tuple] = []
        self._lock = threading.Lock()  # a freed engine reports from whichever thread collects it
        self._send = threading.Lock()  # the engine's and the keep-alive's messages, one at a time, in order
        self._serials = itertools.count()
        self._sent: dict[int, set[str]] = {}
        self.stopped = False
        self.last_step, self.last_sent = 0.0, time.monotonic()  # no step yet: idle
        self.in_step = False
        self.keep_alive_s = min(timeout_s / 4, 2.0)
        if tp.control is not tp.group:  # on one shared group its messages would cross the forward's sums
            threading.Thread(target=self._keep_alive, name="caidllm-tp-keepalive", daemon=True).start()

    def activity(self) -> str:
        """What rank 0 is doing, as a failure names it."""
        return "decoding" if self.in_step or time.monotonic() - self.last_step < 1.0 else "idle"

    def _keep_alive(self) -> None:
        while not self.stopped:
            time.sleep(self.keep_alive_s / 2)
            if time.monotonic() - self.last_sent >= self.keep_alive_s:
                try:
                    self.flush()
                except RankFailure:
                    return  # the watchdog or the engine's next step reports it

    def attach(self, engine) -> None:
        serial = next(self._serials)
        engine.mirror_serial = serial
        self._sent[serial] = set()
        queue = scheduler(engine)
        self.record(engine, "engine", queue.max_batch, queue.max_queue)
        weakref.finalize(engine, self._freed, serial)

    def record(self, engine, op: str, *args) -> None:
        with self._lock:
            self._pending.append((op, engine.mirror_serial, *args))

    def _freed(self, serial: int) -> None:
        with self._lock:
            self._pending.append(("free", serial))
            self._sent.pop(serial, None)

    def after_step(self, engine, events) -> None:
        """Remember what the step committed: the next message carries it for the others to compare."""
        self.record(engine, "check", digest(events))
        self.in_step, self.last_step = False, time.monotonic()

    def before_step(self, engine) -> None:
        """Send the other ranks what changed, then the step itself."""
        sent = self._sent[engine.mirror_serial]
        queued = scheduler(engine).queue
        new = [
            (
                r.id,
                r.prompt,
                r.config,
                _state(r.generator),
                _state(getattr(r.policy_state, "generator", None)),
            )
            for r in queued
            if r.id not in sent
        ]
        self._sent[engine.mirror_serial] = {r.id for r in queued}
        if new:
            self.record(engine, "requests", new)
        self.record(engine, "step")
        if self.activity() == "idle":
            trace("decoding")
        self.in_step = True
        self.flush()

    def flush(self, last: bool = False) -> None:
        with self._send:
            if self.stopped:
                return  # "stop" went: nobody listens any more
            with self._lock:
                ops, self._pending = self._pending, []
            self.stopped = last
            self.last_sent = time.monotonic()
            broadcast(self.tp, ops)

    def stop(self) -> None:
        """Tell the other ranks to leave (their follow() returns)."""
        with self._lock:
            self._pending.append(("stop", -1))
        self.flush(last=True)


def scheduler(engine):
    """What holds an engine's queue: the mask engine's scheduler; a UniformEngine is its own."""
    return getattr(engine, "scheduler", engine)


def digest(events) -> int:
    """What a step committed, in a few bytes: every rank must commit exactly rank 0's tokens."""
    text = repr([(e.request_id, e.positions, e.token_ids, e.finished) for e in events])
    return zlib.crc32(text.encode())


def _state(generator):
    return None if generator is None else generator.get_state()


def injected_fault(rank: int):
    """The failure tests' hook: CAIDLLM_TP_FAULT=RANK:STEP:die|raise|hang makes that rank exit at once
    (a dead process), raise (a reported error) or hang at that step of its own (0: announced, before it
    joins the group, launch.py); (step, kind) or None."""
    spec = os.environ.get("CAIDLLM_TP_FAULT", "")
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] != str(rank):
        return None
    return int(parts[1]), parts[2]


def fail(kind: str) -> None:
    if kind == "die":
        os._exit(9)
    if kind == "hang":
        time.sleep(3600)
    raise RuntimeError("injected fault (CAIDLLM_TP_FAULT)")


def follow(lm, tp: TPGroup) -> None:
    """A rank other than 0: replay rank 0's engine inputs and step, until told to stop."""
    engines: dict[int, Engine] = {}
    fault, steps = injected_fault(tp.rank), 0
    while True:
        for op, serial, *args in broadcast(tp, None):
            if op == "stop":
                return
            if op == "engine":
                engines[serial] = engine_class(lm)(lm, max_batch=args[0], max_queue=args[1])
            elif op == "free":
                engines.pop(serial, None)
            else:
                steps += op == "step"
                if fault is not None and steps == fault[0]:
                    fail(fault[1])
                REPLAY[op](engines[serial], *args)


def engine_class(lm) -> type:
    """The engine rank 0 makes for `lm`: the uniform family's (DiffusionGemma) or the mask engine."""
    from ..decode.uniform_engine import UniformEngine
    from ..models.families import get_family

    return UniformEngine if get_family(lm.config.family).uniform else Engine


def _add_requests(engine: Engine, requests) -> None:
    for request_id, prompt, config, state, order_state in requests:
        request = engine.prepare(prompt, config, request_id)
        if state is not None:
            request.generator.set_state(state)
        if order_state is not None:
            request.policy_state.generator.set_state(order_state)
        scheduler(engine).add_checked([request])


def _step(engine: Engine) -> None:
    engine.last_digest = digest(engine.step())
    engine.take_faults()  # rank 0 reports a request's failure; here it has left the engine alike


def _check(engine: Engine, expected: int) -> None:
    if getattr(engine, "last_digest", expected) != expected:
        raise RanksDiverged(
            "this rank's step committed other tokens than rank 0's: the ranks' forwards "
            "diverged (their logits must be identical on every rank)"
        )


def _cancel(engine: Engine, request_id: str) -> None:
    if scheduler(engine).holds(request_id):
        engine.cancel(request_id)


REPLAY = {
    "requests": _add_requests,
    "step": _step,
    "check": _check,
    "cancel": _cancel,
    "cancel_all": lambda engine: engine.cancel_all(),
    "drop_running": lambda engine: engine.drop_running(),
}
