"""The OpenAI-compatible HTTP server (FastAPI) over the step-level engine.

One model and one engine per app; the engine loop runs in a background
thread (decode/background.py) from startup to shutdown. Each choice of a
request is one engine request; its commit events become text deltas
(serve/answer.py), and serve/call.py follows it to its end. The edge
(serve/guard.py) checks the key and the body size before an endpoint runs;
a large body is decoded and tokenised off the event loop, so it never
delays another request. Errors are OpenAI error bodies, never tracebacks.
"""

from __future__ import annotations

import asyncio
import gc
import json
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

from caidllm.decode.background import BackgroundEngine, engine_for
from caidllm.decode.block_diffusion import applicable
from caidllm.decode.diffusiongemma_settings import UNIFORM_METHODS
from caidllm.decode.presets import lays_blocks
from caidllm.decode.uniform_engine import UniformEngine
from caidllm.errors import EngineFullError, InputError
from caidllm.models.quantize import quantization_info
from caidllm.serve.answer import Answer
from caidllm.serve.body_fields import check_fields
from caidllm.serve.call import CLIENT_CLOSED, Call, cancel
from caidllm.serve.guard import Guard, check_json_content_type, error_response, read_body
from caidllm.serve.http_edges import id_list_bounds
from caidllm.serve.metrics import ServerMetrics
from caidllm.serve.prompt_input import prompt_char_limit
from caidllm.serve.protocol import RequestError, ServerDefaults, parse
from caidllm.serve.shutdown import Shutdown

logger = logging.getLogger("caidllm.serve")
STATIC = Path(__file__).parent / "static"  # the live view (plain HTML/CSS/JS, shipped in the package)
# Bodies up to this size are decoded and tokenised on the event loop (fast). At 64 KB a conversation of
# 1,800 turns (its chat template and tokenizer) held the loop 72 ms on a loaded 2-core machine; 16 KB: a
# quarter of it.
INLINE_PARSE_BYTES = 16 * 1024


@dataclass
class ServerConfig:
    """How `caidllm serve` runs: request defaults, engine limits, API key, time limit, replica name."""

    defaults: ServerDefaults
    max_batch: int = 8
    max_queue: int = 64
    api_key: str | None = None
    max_request_time: float = 600.0  # seconds from receipt to the last token
    max_body_bytes: int = 4 * 1024 * 1024  # past it: 413, before the body is read
    body_timeout: float = 10.0  # seconds to receive the whole body; past it: 408
    shutdown_grace: float = 10.0  # seconds requests in flight may go on after SIGTERM
    step_policy: str | None = (
        None  # which forward groups run at each step (decode/step_policies.py; None: fair)
    )
    replica: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    prefix_cache_mb: float | None = (
        None  # the prefix store (decode/prefix_reuse.py): None = the default, 0 = off
    )


@dataclass
class _Server:
    """What every route of one app shares: the model, its settings, the engine thread, the metrics
    and the drain state."""

    lm: object
    settings: ServerConfig
    background: BackgroundEngine
    metrics: ServerMetrics
    shutdown: Shutdown


def create_app(lm, settings: ServerConfig, *, engine_thread: bool = True) -> FastAPI:
    """The app. With engine_thread the engine loop runs in its own thread from startup to
    shutdown; without, the caller runs `app.state.background.run_here()` (serve/cli.py)."""
    server = _server_for(lm, settings)
    # redirect_slashes off: a path with a trailing slash is the route (Guard), another unknown one a JSON 404
    app = FastAPI(
        title="caidllm",
        lifespan=_lifespan(server, engine_thread),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )
    app.state.background, app.state.metrics, app.state.settings = server.background, server.metrics, settings
    app.state.shutdown = server.shutdown
    app.add_middleware(Guard, settings=settings)
    _add_error_handlers(app, server.metrics)
    _add_status_routes(app, server)
    _add_generation_routes(app, server)
    return app


def _server_for(lm, settings: ServerConfig) -> _Server:
    """The engine (not started yet) and what watches it; fills the prompt-size default from the model."""
    background = BackgroundEngine(
        engine_for(
            lm,
            max_batch=settings.max_batch,
            max_queue=settings.max_queue,
            **_mask_engine_options(settings),
        )
    )
    metrics = ServerMetrics(background)
    if isinstance(background.engine, UniformEngine):  # its own decoders' default, its canvas as the block
        if settings.defaults.method not in UNIFORM_METHODS:
            settings.defaults.method = UNIFORM_METHODS[0]
        settings.defaults.block_length = background.engine.canvas_length
    if settings.defaults.max_prompt_chars is None:
        settings.defaults.max_prompt_chars = prompt_char_limit(lm)
    return _Server(lm, settings, background, metrics, Shutdown(settings.shutdown_grace))


def _mask_engine_options(settings: ServerConfig) -> dict:
    """The mask engine's own options that the server sets (left out when unset: the uniform-state engine
    has neither)."""
    options = {"prefix_cache_mb": settings.prefix_cache_mb, "step_policy": settings.step_policy}
    return {k: v for k, v in options.items() if v is not None}


def _lifespan(server: _Server, engine_thread: bool):
    @asynccontextmanager
    async def lifespan(app):
        server.shutdown.loop = asyncio.get_running_loop()
        if engine_thread:
            server.background.start()
        yield
        if engine_thread:
            server.background.stop(timeout=30)  # cancels whatever is still queued or in flight

    return lifespan


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error leaves as an OpenAI error body, counted by kind; never a traceback."""

    @app.exception_handler(RequestError)
    async def refused(request, error: RequestError):
        metrics.requests.labels("queue_full" if error.status == 429 else "refused").inc()
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, error):
        return error_response(
            RequestError(
                str(error.detail),
                None,
                error.status_code,
                "not_found_error" if error.status_code == 404 else "invalid_request_error",
                headers=error.headers,
            )
        )

    @app.exception_handler(Exception)
    async def crashed(request, error):
        logger.exception("request failed")
        metrics.requests.labels("failed").inc()
        return error_response(
            RequestError(f"internal error: {type(error).__name__}", None, 500, "server_error")
        )


def _add_status_routes(app: FastAPI, server: _Server) -> None:
    """The routes that describe the server rather than generate: health, the live view, info,
    the model list and the Prometheus metrics."""
    settings, lm = server.settings, server.lm

    @app.get("/health")
    async def health():
        alive = server.background.alive
        failure = server.shutdown.failure
        status = (
            "failed" if failure else "draining" if server.shutdown.draining else "ok" if alive else "stopped"
        )
        return JSONResponse(
            {"status": status, "replica": settings.replica, **({"error": failure} if failure else {})},
            status_code=200 if status == "ok" else 503,
        )

    @app.get("/", include_in_schema=False)
    async def live_view():
        return FileResponse(STATIC / "index.html")

    weights = {"dtype": str(lm.dtype).removeprefix("torch."), **quantization_info(lm)}  # fixed at start
    info = _info(settings, lm, weights)  # fixed at start too

    @app.get("/caidllm/info")
    async def server_info():
        return info

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.defaults.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "caidllm",
                    **weights,
                }
            ],
        }

    @app.get("/metrics")
    async def prometheus():
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _info(settings: ServerConfig, lm, weights: dict) -> dict:
    """What /caidllm/info says of the server. methods: the decoders that apply to the loaded model;
    one_block_methods: Elastic-Cache's official loop, one block of gen_length (the page sends it no
    block_length); uniform_methods: the uniform-state decoders (no mask token: the page draws their draft
    canvases)."""
    d = settings.defaults
    methods, uniform = applicable(lm.config)[0], set(UNIFORM_METHODS)
    return {
        "model": d.model_name,
        "methods": methods,
        "method": d.method,
        "gen_length": d.gen_length,
        "block_length": d.block_length,
        "one_block_methods": [m for m in methods if m not in uniform and not lays_blocks(m)],
        "uniform_methods": [m for m in methods if m in uniform],
        "replica": settings.replica,
        **weights,
    }


def _add_generation_routes(app: FastAPI, server: _Server) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(server, request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(server, request, "chat")


async def _serve(server: _Server, request: Request, kind: str):
    """One generation request: read and parse the body, submit each prompt, then answer (streamed or not)."""
    received = time.perf_counter()
    lm, settings = server.lm, server.settings
    check_json_content_type(request)
    if server.shutdown.draining:
        raise RequestError(server.shutdown.refusal(), None, 503, "server_error", "shutting_down")
    raw = await read_body(request, settings.max_body_bytes, settings.body_timeout)
    if raw is None:  # the client left while sending
        return Response(status_code=CLIENT_CLOSED)
    if kind == "completion" and len(raw) > INLINE_PARSE_BYTES:
        _check_id_lists(
            raw, settings.defaults.max_prompt_tokens or lm.config.max_length, settings.defaults.max_prompts
        )
    if len(raw) <= INLINE_PARSE_BYTES:
        req = _decode_and_parse(raw, kind, lm, settings.defaults)
    else:  # json.loads and the tokenizer let the event loop (and other requests) run meanwhile
        req = await asyncio.to_thread(_decode_and_parse, raw, kind, lm, settings.defaults)
    handles = _submit(server.background, req, asyncio.get_running_loop())
    answers = [
        Answer(lm, req.config.gen_length, req.max_tokens, req.stop, run_to_end=not req.config.early_stop)
        for _ in handles
    ]
    call = Call(
        req,
        handles,
        answers,
        received,
        f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        server.background,
        server.metrics,
        settings,
        server.shutdown,
    )
    if req.stream:
        return StreamingResponse(
            call.stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    return await call.respond(request)


def _decode_and_parse(raw: bytes, kind: str, lm, defaults: ServerDefaults):
    if len(raw) > INLINE_PARSE_BYTES:  # unknown fields and fields over their limits refused unparsed
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RequestError(f"the request body is not valid JSON: {error}"[:500]) from None
        check_fields(raw, defaults.max_prompt_tokens or lm.config.max_length)
    # The collector paused while json.loads runs: it holds the interpreter throughout, and a body of a
    # million small lists made the collector rescan them all, over and over (2 s with no other request
    # served; 0.3 s without it). Nothing it builds can be a cycle.
    enabled = gc.isenabled()
    gc.disable()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, nested past Python's limit
        raise RequestError(f"the request body is not valid JSON: {error}"[:500]) from None
    finally:
        if enabled:
            gc.enable()
    return parse(body, kind, lm, defaults)


def _check_id_lists(raw: bytes, limit: int, max_prompts: int) -> None:
    """A token-id list longer than any prompt may be, or more prompts than a request may hold, is
    refused from the body's bytes, before json.loads builds an object for each entry."""
    longest, lists = id_list_bounds(raw)
    if longest > limit:
        raise RequestError(
            f"the prompt holds a list of about {longest} token ids; a prompt has at most {limit} "
            "tokens here (the model's context, or --max-prompt-tokens)",
            "prompt",
        )
    if lists > max_prompts:
        raise RequestError(f"about {lists} prompts in one request; at most {max_prompts}", "prompt")


def _submit(background, req, loop) -> list:
    handles = []
    try:
        for ids in req.prompts:
            handles.append(
                background.submit(
                    ids, req.config, loop=loop, constraint=req.constraint, logprobs=req.logprobs
                )
            )
    except (InputError, EngineFullError) as error:
        for h in handles:
            cancel(background, h.id)
        if isinstance(error, EngineFullError):
            raise RequestError(
                str(error), None, 429, "rate_limit_error", "queue_full", {"Retry-After": "1"}
            ) from None
        raise RequestError(str(error), _submit_param(error, req)) from None
    return handles


def _submit_param(error: InputError, req) -> str | None:
    """The field an engine refusal at submit is about (error.field): the prompt is the chat's messages;
    a refusal about no one field is about the method given."""
    if error.field == "prompt" and req.kind == "chat":
        return "messages"
    return error.field or ("method" if "method" in req.extensions else None)
