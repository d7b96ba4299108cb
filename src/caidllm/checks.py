"""Small value checks shared by the decoder's config (decode/config.py), generate()'s prompts
(decode/api.py) and the server's request parsing (serve/protocol.py). Predicates only: each
caller words its own error (an InputError, or an HTTP 400 naming the field)."""

from __future__ import annotations

import math


def is_int(value) -> bool:
    """An int (bools are not ints here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float (bools are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def are_numbers(values, count: int) -> bool:
    """A list or tuple of exactly `count` finite numbers."""
    return isinstance(values, (tuple, list)) and len(values) == count and all(is_number(v) for v in values)


def is_id_list(value, allow_empty: bool = False) -> bool:
    """A list (or tuple) of token ids: ints; empty only when allowed."""
    return (
        isinstance(value, (list, tuple)) and (allow_empty or len(value) > 0) and all(is_int(t) for t in value)
    )
