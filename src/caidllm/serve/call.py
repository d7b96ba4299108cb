"""One HTTP request in flight (serve/app.py makes it): its engine requests, their answers, and
every way it can end. Whatever the ending (answered, timed out, client gone, shutdown, a failed
engine step) its engine requests that have not finished are cancelled, so their slots are free at
the engine's next step."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from caidllm.errors import InputError
from caidllm.serve import responses
from caidllm.serve.answer import Answer
from caidllm.serve.guard import error_response
from caidllm.serve.protocol import RequestError

CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection" (nobody reads it)


class ShuttingDown(Exception):
    """The server's grace period ended with this request still running."""


def cancel(background, request_id: str) -> None:
    try:
        background.cancel(request_id)
    except InputError:  # it finished meanwhile
        pass


@dataclass
class Call:
    """One HTTP request in flight: its engine requests (handles), their answers, and how it ends."""

    req: object
    handles: list
    answers: list[Answer]
    received: float
    id: str
    background: object
    metrics: object
    settings: object
    shutdown: object
    first_text_at: float | None = None

    async def _follow(self, index: int, on_delta) -> None:
        """Feed one choice's events to its Answer until it ends; then take it out of the engine."""
        answer, handle = self.answers[index], self.handles[index]
        try:
            async for event in handle.stream():
                delta = answer.update(event)
                if delta and self.first_text_at is None:
                    self.first_text_at = time.perf_counter()
                    self.metrics.ttft.observe(self.first_text_at - self.received)
                await on_delta(index, delta, event)
                if answer.finish_reason:
                    return
        finally:
            if answer.finish_reason is None or answer.result is None:
                cancel(self.background, handle.id)

    async def _run_all(self, on_delta) -> None:
        """Every choice to its end; raises TimeoutError past the request's time, ShuttingDown when the
        grace period ends first, or the engine's error. Cancelled (a client left): the choices stop."""
        timeout = self.settings.max_request_time - (time.perf_counter() - self.received)
        tasks = [asyncio.ensure_future(self._follow(i, on_delta)) for i in range(len(self.handles))]
        gathered = asyncio.gather(*tasks)
        # When this call is cancelled the gather ends with an error nobody awaits: read it here,
        # so asyncio does not log it as lost.
        gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
        expired = asyncio.ensure_future(self.shutdown.expired.wait())
        try:
            done, _ = await asyncio.wait(
                {gathered, expired}, timeout=max(timeout, 0), return_when=asyncio.FIRST_COMPLETED
            )
            if gathered in done:
                return gathered.result()
            if expired in done:
                raise ShuttingDown(
                    f"the server stopped: {self.shutdown.failure}"
                    if self.shutdown.failure
                    else "the server is shutting down and its grace period ended before this request"
                )
            raise asyncio.TimeoutError
        finally:
            expired.cancel()
            for t in tasks:
                t.cancel()

    def _done(self) -> None:
        self.metrics.requests.labels("completed").inc()
        self.metrics.tokens.inc(sum(a.completion_tokens for a in self.answers))
        self.metrics.latency.observe(time.perf_counter() - self.received)

    def _ending(self, error: BaseException) -> RequestError:
        """The OpenAI error a call that did not complete ends with (and its outcome counted)."""
        if isinstance(error, asyncio.TimeoutError):
            self.metrics.requests.labels("timeout").inc()
            return RequestError(
                f"the request took longer than {self.settings.max_request_time:g} s",
                None,
                504,
                "timeout_error",
                "timeout",
            )
        if isinstance(error, ShuttingDown):
            self.metrics.requests.labels("shutdown").inc()
            return RequestError(str(error), None, 503, "server_error", "shutting_down")
        self.metrics.requests.labels("failed").inc()
        return RequestError(f"the request could not be completed: {error}", None, 503, "server_error")

    async def respond(self, request: Request):
        """The non-streamed answer; a client that leaves first cancels the request at once."""

        async def nothing(*_):
            return None

        runner = asyncio.ensure_future(self._run_all(nothing))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({runner, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not runner.done():  # the client left (or this task was cancelled): stop the choices
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
                self.metrics.requests.labels("cancelled").inc()
        if runner.cancelled():
            return Response(status_code=CLIENT_CLOSED)
        if runner.exception() is not None:
            return error_response(self._ending(runner.exception()))
        self._done()
        return JSONResponse(responses.complete(self), headers={"X-Request-Id": self.id})

    async def stream(self):
        """Server-sent events: the first chunk at once, then each step's text; an error event on a
        timeout, a failure or shutdown; always `[DONE]` last unless the client went away."""
        queue: asyncio.Queue = asyncio.Queue()

        async def push(index, delta, event):
            await queue.put((index, delta, event))

        runner = asyncio.ensure_future(self._run_all(push))
        runner.add_done_callback(lambda _: queue.put_nowait(None))
        finished = False
        try:
            yield responses.sse(responses.first_chunk(self))
            while (item := await queue.get()) is not None:
                for chunk in responses.chunks(self, *item):
                    yield responses.sse(chunk)
            error = runner.exception() if not runner.cancelled() else None
            if error is not None:
                yield responses.sse(self._ending(error).body())
            else:
                self._done()
                if self.req.include_usage:
                    yield responses.sse(responses.usage_chunk(self))
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:  # the client went away mid-stream
                self.metrics.requests.labels("cancelled").inc()
            runner.cancel()
            for h in self.handles:
                if h.result is None:
                    cancel(self.background, h.id)


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
