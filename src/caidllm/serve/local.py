"""A server on 127.0.0.1 in a background thread of this process, on a free port
(for tests and the serving benchmark: the model stays loaded in the caller)."""

from __future__ import annotations

import threading
import time

import uvicorn

from caidllm.serve.shutdown import uvicorn_config


class LocalServer:
    def __init__(self, app, start_timeout: float = 60.0):
        grace = app.state.settings.shutdown_grace
        self.config = uvicorn_config(app, "127.0.0.1", 0, "warning", grace)
        self.server = uvicorn.Server(self.config)
        self.start_timeout = start_timeout
        self.thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> LocalServer:
        self.thread = threading.Thread(target=self.server.run, name="caidllm-local-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the local server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.config.app.state.shutdown.begin_from_thread()  # as on SIGTERM: requests in flight drain
        self.thread.join(timeout=30)
