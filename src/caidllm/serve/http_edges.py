"""What the app never sees: malformed HTTP framing, and the size of a body's token-id lists.

uvicorn's h11 layer answers a request it cannot parse (a Content-Length that is not a number, a
chunk size that is not hex) itself, with a plain-text 400; `OpenAIH11Protocol` answers it with the
OpenAI error body instead. `longest_id_list` measures the token-id lists of a completion body from
its bytes, before `json.loads` builds a Python int for each id: a 4 MB list is refused in
milliseconds instead of holding the interpreter (and every other request) for most of a second.
"""

from __future__ import annotations

import json
import re

from uvicorn.protocols.http.h11_impl import H11Protocol

MALFORMED = {"error": {"message": "malformed HTTP request (its framing could not be parsed: a bad Content-Length, "
                                  "a bad chunk size, a bad header line)", "type": "invalid_request_error",
                       "param": None, "code": "bad_http_request"}}


class OpenAIH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose own 400 (a request it cannot parse) carries the OpenAI error body."""

    def send_400_response(self, msg: str) -> None:
        import h11

        if self.cycle is not None and self.cycle.response_started:  # the app answers already: just end it
            self.transport.close()
            return
        body = json.dumps(MALFORMED, separators=(",", ":")).encode("ascii")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


# `"prompt": [` as a key, then the bytes a list (or list of lists) of integers is made of.
_PROMPT_LIST = re.compile(rb'"prompt"\s*:\s*\[')
_NOT_AN_ID_LIST = re.compile(rb"[^0-9\s,\[\]+\-]")


def longest_id_list(raw: bytes) -> int:
    """An upper bound on the entries of the longest integer list in the body's `prompt` (0 when it
    holds none): counted from the bytes, without parsing. A `"prompt"` key spelled with escapes is
    not found here and is measured after parsing, as before."""
    found = _PROMPT_LIST.search(raw)
    if found is None:
        return 0
    start = found.end() - 1
    stop = _NOT_AN_ID_LIST.search(raw, start)
    region = raw[start:stop.start() if stop else len(raw)]
    return max(part.split(b"]", 1)[0].count(b",") + 1 for part in region.split(b"[")[1:])
