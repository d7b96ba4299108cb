"""What a request constrains its answer to (`Constraint`), and the regular expression each kind compiles to:
a regex as given, a JSON schema through outlines-core's schema-to-regex translation, any JSON object, one of a
list of strings. Checked here, before any decoding; every refusal names the field it came from."""

from __future__ import annotations

import json
from dataclasses import dataclass

from caidllm.errors import InputError

# Characters with a meaning in outlines-core's regex syntax: escaped to stand for themselves in a choice.
_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~")

# Nesting depth outlines-core gives an object whose properties are not described (json_object).
ANY_OBJECT_SCHEMA = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """kind: "regex", "json_schema", "json_object" or "choice"; value: the regex, the schema (a dict or its
    JSON text), None, or the list of strings; field: how the caller named it (errors say it)."""

    kind: str
    value: object = None
    field: str = ""
    max_tokens: int | None = None  # the answer is cut there (a server's max_tokens): it must end by then

    def __post_init__(self):
        if self.kind not in REGEX_OF:
            raise InputError(
                f"{self.field or 'constraint'}: unknown kind {self.kind!r}; one of {sorted(REGEX_OF)}"
            )
        if not self.field:
            object.__setattr__(self, "field", self.kind)

    def regex(self) -> str:
        return REGEX_OF[self.kind](self.value, self.field)

    @property
    def is_json(self) -> bool:
        return self.kind in ("json_schema", "json_object")


# Keywords outlines-core's schema translation leaves out of the regex (an answer could break them): refused,
# so that what is returned as valid is valid. (Measured: "minimum" is not held; docs/structured-output.md.)
UNENFORCED = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
)


def _unenforced(schema, path: str = "") -> str | None:
    """The first keyword of UNENFORCED in `schema` (its place in the schema), else None."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in UNENFORCED and not path.endswith(("properties", "$defs")):
                return f"'{key}' at {path or 'the top'}"
            found = _unenforced(value, f"{path}.{key}" if path else key)
            if found:
                return found
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            found = _unenforced(item, f"{path}[{i}]")
            if found:
                return found
    return None


def schema_regex(schema, field: str = "json_schema") -> str:
    from outlines_core.json_schema import build_regex_from_schema

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise InputError(f"{field}: not valid JSON ({error})") from None
    if not isinstance(schema, dict):
        raise InputError(f"{field}: a JSON schema must be an object, got {type(schema).__name__}")
    unenforced = _unenforced(schema)
    if unenforced:
        raise InputError(
            f"{field}: {unenforced} cannot be held by the token automaton (the schema library "
            "leaves it out of its regex); leave it out, or give a regex"
        )
    try:
        return build_regex_from_schema(json.dumps(schema))
    except (ValueError, RuntimeError, TypeError) as error:
        raise InputError(f"{field}: the schema cannot be compiled ({str(error)[:300]})") from None


def _regex(value, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"{field}: a regex must be a non-empty string")
    return value


def _choice(value, field: str) -> str:
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
        raise InputError(f"{field}: a choice must be a non-empty list of non-empty strings")
    return "|".join("(" + "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in v) + ")" for v in value)


REGEX_OF = {
    "regex": _regex,
    "json_schema": schema_regex,
    "json_object": lambda value, field: schema_regex(ANY_OBJECT_SCHEMA, field),
    "choice": _choice,
}


def constraint_of(json_schema=None, regex=None, choice=None, json_object: bool = False) -> Constraint | None:
    """The constraint of generate()'s keywords (None: none given); more than one is refused."""
    given = [
        (kind, value)
        for kind, value in (
            ("json_schema", json_schema),
            ("regex", regex),
            ("choice", choice),
            ("json_object", True if json_object else None),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise InputError(f"give one constraint, not {' and '.join(kind for kind, _ in given)}")
    return Constraint(*given[0]) if given else None


def per_prompt(constraint, count: int) -> list:
    """generate()'s `constraint`: None, one Constraint for every prompt, or a list of one per prompt."""
    if isinstance(constraint, (list, tuple)):
        if len(constraint) != count:
            raise InputError(
                f"constraint: {len(constraint)} constraints for {count} prompts; give one per prompt"
            )
        return list(constraint)
    return [constraint] * count
