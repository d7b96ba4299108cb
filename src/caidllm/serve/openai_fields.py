"""The OpenAI request fields caidllm accepts only at their neutral value (n=1, top_p=1, no penalties,
...): each first checked for the OpenAI API's type and range, then for neutrality.

So `top_p: 2` is refused as out of range, `top_p: 0.5` as not supported, and JSON `true` is never
read as 1 (`n: true`, `best_of: true`, `presence_penalty: false` are refused as wrong types), which
Python's `True == 1` would otherwise let through. A field absent or null is its default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from caidllm.checks import is_int, is_number


@dataclass(frozen=True)
class NeutralField:
    """`ok(value, kind)`: the OpenAI API's type and range ("<name> must be <expected>"); `neutral(value)`:
    the values that change nothing (else "<name>=<value> is not supported by caidllm (<why>)")."""

    name: str
    expected: str
    ok: Callable[[object, str], bool]
    neutral: Callable[[object], bool]
    why: str = "only its default"

    def problem(self, value, kind: str) -> str | None:
        if not self.ok(value, kind):
            return f"{self.name} must be {self._expected(kind)}, got {value!r}"
        if not self.neutral(value):
            return f"{self.name}={value!r} is not supported by caidllm ({self.why})"
        return None

    def _expected(self, kind: str) -> str:
        return self.expected.split("|")[0 if kind == "chat" else -1]


def _int_in(low: int, high: int) -> Callable[[object, str], bool]:
    return lambda v, kind: is_int(v) and low <= v <= high


def _number_in(low: float, high: float, open_low: bool = False) -> Callable[[object, str], bool]:
    return lambda v, kind: is_number(v) and (low < v if open_low else low <= v) and v <= high


def _is(kind_of) -> Callable[[object, str], bool]:
    return lambda v, kind: isinstance(v, kind_of) and not (kind_of is int and isinstance(v, bool))


def _bool(v, kind) -> bool:
    return isinstance(v, bool)


def _never(v) -> bool:
    return False


def _equals(neutral) -> Callable[[object], bool]:
    # Checked after the type (booleans are not numbers there), so True is never taken for 1.
    return lambda v: v == neutral


TEXT_ONLY = "text is its only output"
_RULES = [
    NeutralField(
        "n",
        "an integer in [1, 128]",
        _int_in(1, 128),
        _equals(1),
        "one choice per prompt; send the prompt again, or a list of prompts to /v1/completions",
    ),
    NeutralField("best_of", "an integer in [1, 20]", _int_in(1, 20), _equals(1)),
    NeutralField(
        "top_p",
        "a number in (0, 1]",
        _number_in(0, 1, open_low=True),
        _equals(1),
        "no nucleus sampling: only 1",
    ),
    NeutralField("presence_penalty", "a number in [-2, 2]", _number_in(-2, 2), _equals(0)),
    NeutralField("frequency_penalty", "a number in [-2, 2]", _number_in(-2, 2), _equals(0)),
    NeutralField(
        "repetition_penalty", "a positive number", lambda v, kind: is_number(v) and v > 0, _equals(1)
    ),
    NeutralField(
        "logit_bias",
        "an object of token id -> number in [-100, 100]",
        lambda v, kind: isinstance(v, dict) and all(is_number(b) and -100 <= b <= 100 for b in v.values()),
        lambda v: v == {},
    ),
    NeutralField("functions", "a list", _is(list), lambda v: v == [], "no function calls"),
    NeutralField(
        "function_call", "a string or an object", _is((str, dict)), lambda v: v == "none", "no function calls"
    ),
    NeutralField(
        "parallel_tool_calls", "true or false", _bool, lambda v: v is False, "one tool call per answer"
    ),
    NeutralField("suffix", "a string", _is(str), _never, "no insertion"),
    NeutralField("service_tier", "a string", _is(str), _never),
    NeutralField("store", "true or false", _bool, lambda v: v is False, "nothing is stored"),
    NeutralField("metadata", "an object", _is(dict), _never, "nothing is stored"),
    NeutralField("modalities", "a list", _is(list), lambda v: v == ["text"], TEXT_ONLY),
    NeutralField("audio", "an object", _is(dict), _never, TEXT_ONLY),
    NeutralField("prediction", "an object", _is(dict), _never),
    NeutralField("reasoning_effort", "a string", _is(str), _never),
    NeutralField("web_search_options", "an object", _is(dict), _never),
]
NEUTRAL: dict[str, NeutralField] = {rule.name: rule for rule in _RULES}
