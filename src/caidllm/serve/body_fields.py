"""A large body's top-level fields measured from its text before `json.loads` builds a Python object
for each of their values: an unknown field is refused (never parsed), and a field holding more values
(or bytes) than any request needs is refused with its name and its limit.

Why: `json.loads` is one C call that holds the interpreter throughout, in whichever thread it runs, so
a 4 MB list of numbers (in an unknown field, a `logit_bias` map, a message list) held every other
request and `/health` for a third of a second. This scan runs in a worker thread (bodies over
app.INLINE_PARSE_BYTES (16 KB) only: a smaller one parses in well under a millisecond) and in short C calls
(a string skipped by the json module's scanner, the separators between two brackets counted with
`str.count`, the next bracket searched a chunk at a time), so the event loop runs between them.
A value's count is an upper bound: the commas outside strings, plus one per container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from json.decoder import scanstring

from caidllm.serve.openai_fields import NEUTRAL
from caidllm.serve.protocol import EXTENSIONS, OPENAI_FIELDS, OWN_FIELDS, RequestError
from caidllm.serve.stops import MAX_STOP_CHARS, MAX_STOP_SEQUENCES

KNOWN = OPENAI_FIELDS | EXTENSIONS | OWN_FIELDS | set(NEUTRAL)
_STRUCTURE = re.compile(r'["\[\]{}]')
_SPACE = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null")
_CHUNK = 1 << 18  # characters searched per C call: ~1 ms, so the event loop is never held long

SETTING_VALUES = 256  # any other field: a scalar or a small object (`cai`: 19 settings), 256 values at most
SETTING_BYTES = 16 * 1024
# Fields that carry JSON schemas or patterns (tools, structured output): OpenAI's 128 tools with their
# parameters' schemas fit; json.loads of this many values takes about a millisecond.
SCHEMA_FIELDS = {"tools", "response_format", "regex", "choice"}
SCHEMA_VALUES = 16 * 1024
SCHEMA_BYTES = 256 * 1024
NOTES = {"stop": f" (at most {MAX_STOP_SEQUENCES} sequences of {MAX_STOP_CHARS} characters)"}
# 12 bytes: a character written as two \uXXXX escapes
STOP_BYTES = MAX_STOP_SEQUENCES * (MAX_STOP_CHARS * 12 + 4) + 64


@dataclass
class FieldSpan:
    start: int  # the value's first and past-last character in the body's text
    end: int
    values: int  # an upper bound on the JSON values it holds (itself included)


def check_fields(text: str, context_tokens: int) -> None:
    """Refuse (RequestError naming the field) an unknown field or one over its limit, from the text."""

    def allowed(name: str, start: int) -> int:
        if name in KNOWN:
            return _limits(name, context_tokens)[0]
        if text.startswith("null", start):  # a null field is absent (protocol.parse)
            return 1
        raise RequestError(f"unknown field {_label(name)!r}", _label(name))  # before its value is read

    for name, span in top_level_fields(text, allowed):
        values, size = _limits(name, context_tokens)
        if span.values > values:  # the scan stopped at the first value past the limit
            raise RequestError(
                f"{_label(name)} holds more than {values} values; at most {values} here", _label(name)
            )
        if span.end - span.start > size:
            note = NOTES.get(name, "")
            length = span.end - span.start
            raise RequestError(
                f"{_label(name)} is {length} characters long; at most {size} here{note}", _label(name)
            )


def _label(name: str) -> str:
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _limits(name: str, context_tokens: int) -> tuple[int, float]:
    """(values, characters) a field may hold. The prompt's id lists are bounded by http_edges.py and
    its text by the model's context (protocol.prompt_char_limit); a conversation cannot hold more
    messages than the context holds tokens (every turn adds some), a few values each."""
    if name == "prompt":
        return 16 * (context_tokens + 1) + 1, float("inf")
    if name == "messages":
        return 8 * context_tokens, float("inf")
    if name == "stop":
        return MAX_STOP_SEQUENCES + 1, STOP_BYTES
    if name in SCHEMA_FIELDS:
        return SCHEMA_VALUES, SCHEMA_BYTES
    return SETTING_VALUES, SETTING_BYTES


def top_level_fields(text: str, allowed=None):
    """Each top-level key of a JSON object text with its value's span, in order (json.loads keeps the last
    of a repeated key). allowed(key, start): the values the scan reads in that key's value before it
    stops (the span then ends where it stopped); it may raise instead. A text that is not an object is
    refused as json.loads would refuse it."""
    pos = _space(text, 0)
    if not text.startswith("{", pos):
        raise RequestError("the request body must be a JSON object")
    pos = _space(text, pos + 1)
    if text.startswith("}", pos):
        return _ended(text, pos + 1)
    while True:
        if not text.startswith('"', pos):
            raise _invalid("a key in double quotes", pos)
        key, pos = _string(text, pos)
        pos = _space(text, pos)
        if not text.startswith(":", pos):
            raise _invalid("':'", pos)
        start = _space(text, pos + 1)
        limit = allowed(key, start) if allowed is not None else float("inf")
        end, values = _skip_value(text, start, limit)
        yield key, FieldSpan(start, end, values)
        pos = _space(text, end)
        if text.startswith("}", pos):
            return _ended(text, pos + 1)
        if not text.startswith(",", pos):
            raise _invalid("',' or '}'", pos)
        pos = _space(text, pos + 1)


def _skip_value(text: str, pos: int, limit: float) -> tuple[int, int]:
    """(the end of the value at pos, an upper bound on the values it holds); past `limit` values, where
    the scan stopped."""
    if text.startswith('"', pos):
        return _string(text, pos)[1], 1
    if not text.startswith(("[", "{"), pos):
        scalar = _SCALAR.match(text, pos)
        if scalar is None:
            raise _invalid("a value", pos)
        return scalar.end(), 1
    depth, values, last = 0, 0, pos
    while True:
        found = _next_structure(text, last)
        if found is None:
            raise _invalid("the end of a list or an object", len(text))
        at = found.start()
        values += text.count(",", last, at)
        if values > limit:
            return at, values
        if found.group() == '"':
            last = _string(text, at)[1]
            continue
        depth += 1 if found.group() in "[{" else -1
        values += found.group() in "[{"
        last = at + 1
        if depth == 0 or values > limit:
            return last, values


def _next_structure(text: str, pos: int):
    while pos < len(text):
        found = _STRUCTURE.search(text, pos, pos + _CHUNK)
        if found is not None:
            return found
        pos += _CHUNK
    return None


def _string(text: str, pos: int) -> tuple[str, int]:
    try:
        return scanstring(text, pos + 1, True)
    except ValueError as error:
        raise RequestError(f"the request body is not valid JSON: {error}"[:500]) from None


def _space(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()


def _ended(text: str, pos: int) -> None:
    if _space(text, pos) != len(text):
        raise _invalid("the end of the body", _space(text, pos))


def _invalid(expected: str, pos: int) -> RequestError:
    return RequestError(f"the request body is not valid JSON: expected {expected} at character {pos}")
