"""How the server stops, and the uvicorn settings every caidllm server runs with.

On SIGTERM (serve/cli.py) uvicorn stops accepting connections and the app
starts draining: new requests get 503, requests in flight go on until the
grace period ends; then each one still running ends itself cleanly (a
streamed one with an error event and `[DONE]`, a non-streamed one with a 503
OpenAI body) and leaves the engine, so uvicorn never has to cut a
connection mid-body and the process exits within the grace period plus a
moment.
"""

from __future__ import annotations

import asyncio

import uvicorn

# uvicorn cuts what is still open this long after the grace period: only a backstop, the calls end first.
BACKSTOP_S = 1.0


class Shutdown:
    """The drain state of one app: `draining` from the signal on, `expired` set when the grace ends."""

    def __init__(self, grace: float):
        self.grace = grace
        self.draining = False
        self.expired = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's loop, set at startup

    def begin(self) -> None:
        """On the server's loop: start draining, and end what is left after the grace period."""
        if not self.draining:
            self.draining = True
            asyncio.get_running_loop().call_later(self.grace, self.expired.set)

    def begin_from_thread(self) -> None:
        """From a signal handler or another thread."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.begin)


def uvicorn_config(app, host: str, port: int, log_level: str, grace: float, **kw) -> uvicorn.Config:
    """h11 rather than httptools: httptools answers a request with an unknown method (`BREW /health`)
    with its own plain-text 400 before the app sees it; with h11 the app answers an OpenAI 405 body."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http="h11", lifespan="on",
                          timeout_graceful_shutdown=grace + BACKSTOP_S, **kw)
