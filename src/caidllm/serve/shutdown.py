"""How the server stops, and the uvicorn settings every caidllm server runs with.

On SIGTERM / SIGINT (serve/cli.py) the app starts draining and the listener stays open: `/health`
answers 503 `draining` and new requests 503 with the OpenAI body, so a load balancer (or a client
on a kept-alive connection) sees the drain instead of a refused connection. Requests in flight go on
until the grace period ends; then each one still running ends itself cleanly (a streamed one with an
error event and `[DONE]`, a non-streamed one with a 503 OpenAI body) and leaves the engine, and only
then does uvicorn stop: it never has to cut a connection mid-body, and the process exits within the
grace period plus a moment. A second signal ends the grace period at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import uvicorn

from caidllm.serve.http_edges import OpenAIH11Protocol

logger = logging.getLogger("caidllm.serve")

# uvicorn cuts what is still open this long after the grace period: only a backstop, the calls end first.
BACKSTOP_S = 1.0
FAILED_GRACE_S = 1.0  # after a rank failure: the engine's own error reaches the requests in flight first


class Shutdown:
    """The drain state of one app: `draining` from the first signal on, `expired` set when the grace
    period ends (or at a second signal); then `on_expired` (serve/cli.py: stop uvicorn) runs."""

    def __init__(self, grace: float):
        self.grace = grace
        self.draining = False
        self.expired = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's loop, set at startup
        self.on_expired: Callable[[], None] | None = None
        self.failure: str | None = (
            None  # why the server cannot serve any more (a tensor-parallel rank failed)
        )

    def begin(self) -> None:
        """On the server's loop: start draining; a second call (a second signal) ends the drain now."""
        if self.draining:
            return self.expire()
        self.draining = True
        logger.warning(
            "draining: requests in flight have %g s; new ones get 503 (signal again to stop now)", self.grace
        )
        asyncio.get_running_loop().call_later(self.grace, self.expire)

    def expire(self) -> None:
        if not self.expired.is_set():
            self.expired.set()
            if self.on_expired is not None:
                self.on_expired()

    def fail(self, failure: str) -> None:
        """On the server's loop: the server cannot decode any more (`failure` says why: /health and every
        refusal name it). The requests in flight get a moment for the engine's own error, then end."""
        self.failure = failure
        logger.error("stopping: %s", failure)
        if not self.draining:
            self.draining = True
        asyncio.get_running_loop().call_later(min(self.grace, FAILED_GRACE_S), self.expire)

    def fail_from_thread(self, failure: str) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.fail, failure)
        else:  # before the server started: nothing to fail
            self.failure = failure
            if self.on_expired is not None:
                self.on_expired()

    def refusal(self) -> str:
        """What a request refused while draining is told."""
        return "the server is shutting down" + (f": {self.failure}" if self.failure else "")

    def begin_from_thread(self) -> None:
        """From a signal handler or another thread."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.begin)
        elif self.on_expired is not None:  # before the server started: nothing to drain
            self.on_expired()


def uvicorn_config(app, host: str, port: int, log_level: str, grace: float, **kw) -> uvicorn.Config:
    """h11 rather than httptools: httptools answers a request with an unknown method (`BREW /health`)
    with its own plain-text 400 before the app sees it; with h11 the app answers an OpenAI 405 body,
    and malformed framing gets the OpenAI body too (serve/http_edges.py). uvicorn is told to stop only
    when the grace period has ended (serve/cli.py), so it waits for connections no more than BACKSTOP_S."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=OpenAIH11Protocol,
        lifespan="on",
        timeout_graceful_shutdown=BACKSTOP_S,
        **kw,
    )
