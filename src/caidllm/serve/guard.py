"""The server's edge, before any endpoint runs: the API key, the body size limit,
the body-read timeout and the JSON Content-Type.

Plain ASGI rather than FastAPI's `@app.middleware("http")`: that wrapper hands the
endpoint a receive channel on which a client's disconnect never shows, so a
non-streamed request could not notice its client leaving.
"""

from __future__ import annotations

import asyncio
import hmac
import json

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from caidllm.serve.protocol import RequestError

# What needs no API key (README "Serving"): health, the live view's page and files, and the view's
# info (model name, methods, defaults, replica id; no secrets, and the page reads it before a key is typed).
OPEN_PATHS = ("/health", "/", "/caidllm/info")
OPEN_PREFIXES = ("/static/",)
CLOSE = {"Connection": "close"}  # after a refused body: the rest of it is not read, the connection ends


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def authorised(authorization: str, key: str) -> bool:
    """`Bearer KEY`; the scheme is case-insensitive (RFC 9110), the key compared in constant time."""
    scheme, _, token = authorization.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


class _AsciiJSON(JSONResponse):
    """JSON with every non-ASCII character escaped: an error message quoting a client's text
    (a lone surrogate even) can always be sent."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(error: RequestError) -> JSONResponse:
    return _AsciiJSON(error.body(), status_code=error.status, headers=error.headers)


class Guard:
    """ASGI middleware: refuses a request without the API key (401) or whose declared body is
    over the limit (413, before a byte of it is read), and names the replica on every response."""

    def __init__(self, app, settings):
        self.app, self.settings = app, settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        replica = self.settings.replica.encode("latin-1", "replace")

        async def named(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-caidllm-replica", replica)]
            await send(message)

        if len(scope["path"]) > 1 and scope["path"].endswith("/"):
            # `/v1/completions/` is `/v1/completions` (Starlette would answer a 307 with an empty body)
            scope = {**scope, "path": scope["path"].rstrip("/") or "/"}
        refusal = self._refusal(scope)
        if refusal is not None:
            return await error_response(refusal)(scope, receive, named)
        if (
            scope["method"] == "HEAD"
        ):  # as GET; uvicorn sends the headers only (it knows the request's method)
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, named)

    def _refusal(self, scope) -> RequestError | None:
        headers, key = Headers(scope=scope), self.settings.api_key
        if key and not is_open(scope["path"]) and not authorised(headers.get("authorization", ""), key):
            return RequestError(
                "missing or wrong API key (send 'Authorization: Bearer KEY')",
                None,
                401,
                "authentication_error",
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.settings.max_body_bytes:
            return too_large(self.settings.max_body_bytes)
        return None


def too_large(limit: int) -> RequestError:
    return RequestError(
        f"the request body is larger than this server's limit of {limit} bytes "
        "(caidllm serve --max-body-bytes)",
        None,
        413,
        "invalid_request_error",
        "request_too_large",
        CLOSE,
    )


def check_json_content_type(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise RequestError(
            f"the body must be JSON sent with 'Content-Type: application/json', got "
            f"{media or 'no Content-Type'!r}",
            None,
            415,
            code="unsupported_media_type",
        )


async def read_body(request: Request, limit: int, timeout: float) -> bytes | None:
    """The whole body, or None when the client left while sending it. Past `limit` bytes (a body
    without a Content-Length) 413 at once; not all there after `timeout` seconds (a body shorter than
    its Content-Length, a stalled client) 408."""
    chunks: list[bytes] = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise RequestError(
            f"the request body did not arrive whole within {timeout:g} s ({size} bytes came)",
            None,
            408,
            code="request_timeout",
            headers=CLOSE,
        ) from None
    except ClientDisconnect:
        return None
    return b"".join(chunks)
