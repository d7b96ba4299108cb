"""Small checks shared by command-line front ends."""

from __future__ import annotations

import json

from caidllm.errors import InputError


def json_object_option(text: str, flag: str, what: str = "object") -> dict:
    """The JSON object a flag carries, or an InputError naming the flag."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{flag} is not valid JSON: {error.msg}") from None
    if not isinstance(value, dict):
        raise InputError(f"{flag} must be a JSON {what}")
    return value
