"""The OpenAI-compatible HTTP server (FastAPI) over the step-level engine.

One model and one engine per app; the engine loop runs in a background
thread (decode/background.py) from startup to shutdown. Each choice of a
request is one engine request; its commit events become text deltas
(serve/answer.py). Errors are OpenAI error bodies, never tracebacks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from caidllm.decode.background import BackgroundEngine
from caidllm.decode.engine import Engine
from caidllm.decode.presets import method_names
from caidllm.errors import EngineFullError, InputError
from caidllm.serve import responses
from caidllm.serve.answer import Answer
from caidllm.serve.metrics import ServerMetrics
from caidllm.serve.protocol import RequestError, ServerDefaults, parse

logger = logging.getLogger("caidllm.serve")
STATIC = Path(__file__).parent / "static"  # the live view (plain HTML/CSS/JS, shipped in the package)


@dataclass
class ServeSettings:
    defaults: ServerDefaults
    max_batch: int = 8
    max_queue: int = 64
    api_key: str | None = None
    max_request_time: float = 600.0  # seconds from receipt to the last token
    replica: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")


def create_app(lm, settings: ServeSettings, *, engine_thread: bool = True) -> FastAPI:
    """The app. With engine_thread the engine loop runs in its own thread from startup to
    shutdown; without, the caller runs `app.state.background.run_here()` (serve/cli.py)."""
    background = BackgroundEngine(Engine(lm, max_batch=settings.max_batch, max_queue=settings.max_queue))
    metrics = ServerMetrics(background)

    @asynccontextmanager
    async def lifespan(app):
        if engine_thread:
            background.start()
        yield
        if engine_thread:
            background.stop(timeout=30)  # cancels whatever is still queued or in flight

    app = FastAPI(title="caidllm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.background, app.state.metrics, app.state.settings = background, metrics, settings

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if settings.api_key and not _open(request.url.path) and not _authorised(request, settings.api_key):
            return _error(RequestError("missing or wrong API key (send 'Authorization: Bearer KEY')", None, 401,
                                       "authentication_error", "invalid_api_key"))
        response = await call_next(request)
        response.headers["X-Caidllm-Replica"] = settings.replica
        return response

    @app.exception_handler(RequestError)
    async def refused(request, error: RequestError):
        metrics.requests.labels("queue_full" if error.status == 429 else "refused").inc()
        return _error(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error):
        return _error(RequestError(str(error.detail), None, error.status_code,
                                   "not_found_error" if error.status_code == 404 else "invalid_request_error"))

    @app.exception_handler(Exception)
    async def crashed(request, error):
        logger.exception("request failed")
        metrics.requests.labels("failed").inc()
        return _error(RequestError(f"internal error: {type(error).__name__}", None, 500, "server_error"))

    @app.get("/health")
    async def health():
        alive = background.alive
        return JSONResponse({"status": "ok" if alive else "stopped", "replica": settings.replica},
                            status_code=200 if alive else 503)

    @app.get("/", include_in_schema=False)
    async def live_view():
        return FileResponse(STATIC / "index.html")

    @app.get("/caidllm/info")
    async def server_info():
        d = settings.defaults
        return {"model": d.model_name, "methods": method_names(), "method": d.method, "gen_length": d.gen_length,
                "block_length": d.block_length, "replica": settings.replica}

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": settings.defaults.model_name, "object": "model",
                                            "created": int(time.time()), "owned_by": "caidllm"}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(request, "chat")

    async def _serve(request: Request, kind: str):
        received = time.perf_counter()
        try:
            body = await request.json()
        except Exception as error:  # noqa: BLE001 - any undecodable body
            raise RequestError(f"the request body is not valid JSON: {error}") from None
        req = parse(body, kind, lm, settings.defaults)
        handles = _submit(background, req, asyncio.get_running_loop())
        answers = [Answer(lm, req.config.gen_length, req.max_tokens, req.stop, run_to_end=not req.config.early_stop)
                   for _ in handles]
        call = Call(req, handles, answers, received, f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
                    background, metrics, settings)
        if req.stream:
            return StreamingResponse(call.stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await call.respond(request)

    return app


def _submit(background, req, loop) -> list:
    handles = []
    try:
        for ids in req.prompts:
            handles.append(background.submit(ids, req.config, loop=loop))
    except (InputError, EngineFullError) as error:
        for h in handles:
            _cancel(background, h.id)
        if isinstance(error, EngineFullError):
            raise RequestError(str(error), None, 429, "rate_limit_error", "queue_full", {"Retry-After": "1"}) from None
        raise RequestError(str(error), "messages" if req.kind == "chat" else "prompt") from None
    return handles


def _cancel(background, request_id: str) -> None:
    try:
        background.cancel(request_id)
    except InputError:  # it finished meanwhile
        pass


def _open(path: str) -> bool:
    """What needs no API key: health, the live view's page and files, and its info (no secrets in them)."""
    return path in ("/health", "/", "/caidllm/info") or path.startswith("/static/")


def _authorised(request: Request, key: str) -> bool:
    return request.headers.get("authorization", "") == f"Bearer {key}"


def _error(error: RequestError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


@dataclass
class Call:
    """One HTTP request in flight: its engine requests, their answers, and how it ends."""

    req: object
    handles: list
    answers: list[Answer]
    received: float
    id: str
    background: BackgroundEngine
    metrics: ServerMetrics
    settings: ServeSettings
    first_text_at: float | None = None
    disconnected: bool = False

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
                _cancel(self.background, handle.id)

    async def _run_all(self, on_delta) -> None:
        timeout = self.settings.max_request_time - (time.perf_counter() - self.received)
        tasks = [asyncio.ensure_future(self._follow(i, on_delta)) for i in range(len(self.handles))]
        gathered = asyncio.gather(*tasks)
        # When this call is cancelled (a client left) the gather ends with an error nobody awaits:
        # read it here, so asyncio does not log it as lost.
        gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait_for(gathered, timeout)
        finally:
            for t in tasks:
                t.cancel()

    def _done(self) -> None:
        self.metrics.requests.labels("completed").inc()
        self.metrics.tokens.inc(sum(a.completion_tokens for a in self.answers))
        self.metrics.latency.observe(time.perf_counter() - self.received)

    async def respond(self, request: Request):
        async def nothing(*_):
            return None

        watcher = asyncio.ensure_future(self._watch_disconnect(request))
        try:
            await self._run_all(nothing)
        except asyncio.TimeoutError:
            self.metrics.requests.labels("timeout").inc()
            return _error(RequestError(f"the request took longer than {self.settings.max_request_time:g} s",
                                       None, 504, "timeout_error", "timeout"))
        except Exception as error:  # noqa: BLE001 - the client left, shutdown, or a failed engine step
            if self.disconnected:
                return Response(status_code=499)
            return self._failed(error)
        finally:
            watcher.cancel()
        self._done()
        return JSONResponse(responses.complete(self), headers={"X-Request-Id": self.id})

    async def stream(self):
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
                if isinstance(error, asyncio.TimeoutError):
                    self.metrics.requests.labels("timeout").inc()
                    error = RequestError(f"the request took longer than {self.settings.max_request_time:g} s",
                                         None, 504, "timeout_error", "timeout")
                else:
                    self.metrics.requests.labels("failed").inc()
                    error = RequestError(f"the request failed: {error}", None, 503, "server_error")
                yield responses.sse(error.body())
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
                    _cancel(self.background, h.id)

    async def _watch_disconnect(self, request: Request) -> None:
        while True:
            await asyncio.sleep(0.2)
            if await request.is_disconnected():
                self.disconnected = True
                self.metrics.requests.labels("cancelled").inc()
                for h in self.handles:
                    _cancel(self.background, h.id)
                return

    def _failed(self, error):
        self.metrics.requests.labels("failed").inc()
        return _error(RequestError(f"the request could not be completed: {error}", None, 503, "server_error"))
