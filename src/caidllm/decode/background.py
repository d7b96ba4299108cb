"""The engine in a background thread: submit, stream and cancel from any
thread or from an asyncio event loop while it runs (what the server calls).

Only the engine thread touches the Engine. Other threads hand it new
requests and cancellations through a small inbox that it reads at each step
boundary, so `submit` and `cancel` never wait for a step to end. A request is
checked in the caller's thread (Engine.prepare), so a bad one is refused
there and never reaches the engine. Each request's events come back through
its RequestHandle: iterate it (threads) or `async for` over `handle.stream()`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from caidllm.decode.config import DecodeConfig
from caidllm.decode.engine import Engine
from caidllm.decode.request import CommitEvent
from caidllm.decode.uniform_engine import UniformEngine
from caidllm.errors import EngineFullError, InputError, RankFailure
from caidllm.models.families import get_family

logger = logging.getLogger(__name__)


def engine_for(lm, max_batch: int = 8, max_queue: int = 256, **options):
    """The step-level engine of `lm`'s family: the uniform-state family's own (no mask token, canvases of
    random tokens), else the mask engine with `options` (prefix store, step policy: it alone has them).
    Both answer the calls BackgroundEngine makes."""
    if get_family(lm.config.family).uniform:
        return UniformEngine(lm, max_batch=max_batch, max_queue=max_queue)
    if get_family(lm.config.family).sequential:  # Nemotron-Labs-Diffusion: ar, nemotron-dlm, linear-spec
        from caidllm.decode.nemotron_engine import SequentialEngine

        return SequentialEngine(lm, max_batch=max_batch, max_queue=max_queue)
    return Engine(lm, max_batch=max_batch, max_queue=max_queue, **options)


class RequestCancelled(Exception):
    """The request was cancelled (by `cancel`, or because the engine stopped)."""


class RequestHandle:
    """One submitted request as its client sees it: its CommitEvents in order, then its result."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop | None = None):
        self.id = request_id
        self.result = None  # the GenerationResult once finished
        self.error: BaseException | None = None
        self._events: queue.Queue = queue.Queue()
        self._loop = loop
        self._async_events: asyncio.Queue | None = asyncio.Queue() if loop is not None else None

    @property
    def ended(self) -> bool:
        return self.result is not None or self.error is not None

    def _push(self, item) -> None:
        """From the engine thread: a CommitEvent, or an exception that ends the request."""
        _deliver([(self, item)])

    def _record(self, item) -> None:
        if isinstance(item, CommitEvent) and item.finished:
            self.result = item.result
        elif isinstance(item, BaseException):
            self.error = item

    def __iter__(self):
        """Block on each event in turn (thread clients); raises if the request failed or was cancelled."""
        if self._loop is not None:
            raise InputError(
                "this handle was submitted with an event loop; use `async for ... in handle.stream()`"
            )
        while True:
            item = self._events.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return

    async def stream(self):
        """The same events for an asyncio client (the handle must have been made with its loop)."""
        if self._async_events is None:
            raise InputError("this handle was submitted without an event loop; iterate it instead")
        while True:
            item = await self._async_events.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return

    def wait(self):
        """Block until the end; the GenerationResult (raises if the request failed or was cancelled)."""
        if not self.ended or not self._events.empty():
            for _ in self:
                pass
        if self.error is not None:
            raise self.error
        return self.result


def _deliver(pairs: list[tuple[RequestHandle, object]]) -> None:
    """Hand events to their handles: thread clients at once, asyncio clients with one
    wake-up of each event loop per step (not one per event)."""
    by_loop: dict = {}
    for handle, item in pairs:
        handle._record(item)
        if handle._loop is None:
            handle._events.put(item)
        else:
            by_loop.setdefault(handle._loop, []).append((handle, item))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the client's event loop is closed: nobody is listening
            pass


def _put_all(batch) -> None:
    for handle, item in batch:
        handle._async_events.put_nowait(item)


class BackgroundEngine:
    """An Engine driven by a loop of its own (a thread, or the caller's via run_here), which
    other threads and event loops feed: submit and cancel go through an inbox read at each step
    boundary, events come back through each request's RequestHandle."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._inbox: list = []  # prepared Requests not yet queued in the engine
        self._cancels: list[RequestHandle] = []  # handles, not ids: an id may be reused after a finish
        self._handles: dict[str, RequestHandle] = {}  # every request not yet finished
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failed_steps = 0

    # ---- from any thread ------------------------------------------------------------

    def start(self) -> BackgroundEngine:
        """Run the loop in a new thread."""
        self._thread = threading.Thread(target=self._run, name="caidllm-engine", daemon=True)
        self._thread.start()
        return self

    def run_here(self) -> None:
        """Run the loop in the calling thread until `stop()` (from another thread or a signal
        handler). `caidllm serve` runs it in the main thread, where torch ops ran faster on the
        CPU (BENCHMARKS.md, "Where the engine loop runs")."""
        self._thread = threading.current_thread()
        self._run()

    def submit(
        self,
        prompt_ids: list[int],
        config: DecodeConfig,
        request_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        constraint=None,
        logprobs: int | None = None,
    ) -> RequestHandle:
        """Check and hand over a request; raises InputError (bad request) or EngineFullError.
        constraint: structured output (decode/constraints/), compiled and checked here; logprobs:
        Engine.submit's."""
        request = self.engine.prepare(prompt_ids, config, request_id, constraint, logprobs)
        with self._lock:
            if self._stopping or not self.alive:
                raise EngineFullError("the engine is not running (not started, stopped, or shutting down)")
            # The scheduler's limits, counting the requests of the inbox too (its own count lags until the
            # next step).
            self.engine.scheduler.check_room(request.id, request.id in self._handles, len(self._handles))
            handle = RequestHandle(request.id, loop)
            self._handles[request.id] = handle
            self._inbox.append(request)
            self._wake.notify()
        return handle

    def cancel(self, request_id: str) -> None:
        """The request leaves at the next step boundary; its handle then raises RequestCancelled."""
        with self._lock:
            handle = self._handles.get(request_id)
            if handle is None:
                raise InputError(f"cannot cancel request {request_id!r}: unknown or already finished")
            if handle not in self._cancels:
                self._cancels.append(handle)
            self._wake.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop; requests still queued or in flight are cancelled."""
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread is threading.current_thread():
            return  # a signal handler in the loop's own thread: the loop ends at its next check
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._fail_all(RequestCancelled("the engine stopped"))

    @property
    def alive(self) -> bool:
        """Whether the loop is running (started and not ended)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Requests submitted and not finished (queued or in flight)."""
        return len(self._handles)

    @property
    def queued(self) -> int:
        return len(self._inbox) + self.engine.scheduler.queued

    # ---- the engine thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop_until_stopped()
        except BaseException as error:  # noqa: BLE001 - the loop itself broke: nobody may wait forever
            logger.exception("the engine loop stopped")
            with self._lock:
                self._stopping = True
            self._fail_all(RuntimeError(f"the engine loop stopped: {type(error).__name__}: {error}"))

    def _loop_until_stopped(self) -> None:
        while True:
            with self._lock:
                while not (self._inbox or self._cancels or self.engine.has_work or self._stopping):
                    self._wake.wait(timeout=0.5)  # bounded, so signal handlers run in the main thread
                inbox, self._inbox = self._inbox, []
                cancels, self._cancels = self._cancels, []
                stopping = self._stopping
            self.engine.scheduler.add_checked(inbox)
            for handle in cancels:
                if self._handles.get(handle.id) is handle:  # still the request the cancel was for
                    self.engine.cancel(handle.id)
                    self._end(handle.id, RequestCancelled(f"request {handle.id} was cancelled"))
            if stopping:
                self.engine.cancel_all()
                self._fail_all(RequestCancelled("the engine stopped"))
                return
            if not self.engine.has_work:
                continue
            try:
                events = self.engine.step()
            except Exception as error:  # noqa: BLE001 - a bug or a device error: fail the rows in flight, go on
                self.failed_steps += 1
                # a rank's failure is reported in one line (parallel/launch.py); anything else with its
                # traceback
                logger.error(
                    "engine step failed; failing the requests in flight: %s",
                    error,
                    exc_info=not isinstance(error, RankFailure),
                )
                for request_id in self.engine.drop_running():  # queued requests stay and run next
                    self._end(
                        request_id, RuntimeError(f"the engine step failed: {type(error).__name__}: {error}")
                    )
                continue
            for request_id, error in self.engine.take_faults().items():
                logger.error("request %s failed in its decode; the others go on", request_id, exc_info=error)
                self._end(request_id, RuntimeError(f"its decode failed: {type(error).__name__}: {error}"))
            pairs = []
            with self._lock:
                for event in events:
                    handle = (
                        self._handles.pop(event.request_id, None)
                        if event.finished
                        else self._handles.get(event.request_id)
                    )
                    if handle is not None:
                        pairs.append((handle, event))
            _deliver(pairs)

    def _end(self, request_id: str, error: BaseException) -> None:
        with self._lock:
            handle = self._handles.pop(request_id, None)
        if handle is not None:
            handle._push(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            handles, self._handles, self._inbox = list(self._handles.values()), {}, []
        for handle in handles:
            handle._push(error)
