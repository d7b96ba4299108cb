"""What the app never sees: malformed HTTP framing, and the size of a body's token-id lists.

uvicorn's h11 layer answers a request it cannot parse (a Content-Length that is not a number, a
chunk size that is not hex) itself, with a plain-text 400; `OpenAIH11Protocol` answers it with the
OpenAI error body instead. `id_list_bounds` measures the token-id lists of a completion body from
its bytes, before `json.loads` builds a Python int for each id: a 4 MB list is refused in
milliseconds instead of holding the interpreter (and every other request) for most of a second.
"""

from __future__ import annotations

import json
import re

from uvicorn.protocols.http.h11_impl import H11Protocol

MALFORMED = {
    "error": {
        "message": "malformed HTTP request (its framing could not be parsed: a bad Content-Length, "
        "a bad chunk size, a bad header line)",
        "type": "invalid_request_error",
        "param": None,
        "code": "bad_http_request",
    }
}


class OpenAIH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose own 400 (a request it cannot parse) carries the OpenAI error body."""

    def send_400_response(self, msg: str) -> None:
        import h11

        # A response may start only before one has (a fresh connection, or the next request on a kept-alive
        # one: `self.cycle` is then the last, finished one); once the app answers, just end the connection.
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.close()
            return
        body = json.dumps(MALFORMED, separators=(",", ":")).encode("ascii")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()


# `"prompt": [` as a key, then the bytes a list of scalars (or of such lists) is made of: up to a string, an
# object or the next key. Scalars that are not ids (null, 1.5, true) count too: else `[null, 7, 7, ...]`
# would hide a huge list behind its first entry.
_PROMPT_LIST = re.compile(rb'"prompt"\s*:\s*\[')
_END_OF_LIST = re.compile(rb'["{}:]')
_SPLIT_LISTS = 4096  # far above any request's prompts


def id_list_bounds(raw: bytes) -> tuple[int, int]:
    """Upper bounds on (the entries of the longest innermost list, the lists inside a list) in the body's
    `prompt`, counted from the bytes without parsing; (0, 0) when it holds no list. Every `"prompt"` key
    is measured (JSON takes the last of two, and a nested one belongs to a body refused anyway). A key
    spelled with escapes, or a list behind a string entry, is not measured here but after parsing.
    Past _SPLIT_LISTS inner lists only their count is taken (splitting a million of them took 1 s)."""
    longest = lists = 0
    for found in _PROMPT_LIST.finditer(raw):
        start = found.end() - 1
        stop = _END_OF_LIST.search(raw, start)
        end = stop.start() if stop else len(raw)
        inner = raw.count(b"[", start, end) - 1
        lists = max(lists, inner)
        if inner <= _SPLIT_LISTS:
            parts = raw[start:end].split(b"[")[1:]
            longest = max(longest, *(part.split(b"]", 1)[0].count(b",") + 1 for part in parts))
    return longest, lists
