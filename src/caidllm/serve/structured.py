"""Structured output in OpenAI request bodies: `response_format` (`json_object`, `json_schema`), and caidllm's
extensions `regex` (a regular expression) and `choice` (a list of strings), into one `Constraint`
(decode/constraints/). The engine holds it over the canvas in any commit order; every refusal is a 400 naming
the field."""

from __future__ import annotations

from caidllm.decode.constraints import Constraint


class RequestError(ValueError):
    """A refused structured-output field (serve/protocol.py turns it into its 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


FIELDS = ("response_format", "regex", "choice")


def constraint_of(body: dict, max_tokens: int | None) -> Constraint | None:
    """The request's constraint (None: plain text). An answer cut at max_tokens must end by then."""
    given = [
        name for name in FIELDS if name in body and not (name == "response_format" and _is_text(body[name]))
    ]
    if len(given) > 1:
        raise RequestError(f"give one of {', '.join(FIELDS)}, not {' and '.join(given)}", given[1])
    if not given:
        return None
    if body.get("stop"):  # a stop string would cut the constrained answer short
        raise RequestError(
            "stop cannot be combined with a constrained answer (it could cut it short)", "stop"
        )
    name = given[0]
    if name == "regex":
        if not isinstance(body["regex"], str) or not body["regex"]:
            raise RequestError("regex must be a non-empty string", "regex")
        return Constraint("regex", body["regex"], "regex", max_tokens)
    if name == "choice":
        return Constraint("choice", body["choice"], "choice", max_tokens)
    return _response_format(body["response_format"], max_tokens)


def _is_text(value) -> bool:
    return isinstance(value, dict) and value.get("type") == "text" and set(value) == {"type"}


def _response_format(value, max_tokens: int | None) -> Constraint:
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(
            "response_format must be an object with type 'text', 'json_object' or 'json_schema'",
            "response_format",
        )
    if value["type"] == "json_object":
        _only(value, {"type"}, "response_format")
        return Constraint("json_object", None, "response_format", max_tokens)
    _only(value, {"type", "json_schema"}, "response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise RequestError(
            "response_format.json_schema must be an object with name and schema", "response_format"
        )
    _only(spec, {"name", "schema", "strict", "description"}, "response_format.json_schema")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise RequestError("response_format.json_schema.name must be a non-empty string", "response_format")
    if not isinstance(spec.get("strict", False), bool) or not isinstance(spec.get("description", ""), str):
        raise RequestError(
            "response_format.json_schema: strict must be true or false, description a string",
            "response_format",
        )
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict):
        raise RequestError("response_format.json_schema.schema must be an object", "response_format")
    return Constraint("json_schema", schema, "response_format.json_schema.schema", max_tokens)


def _only(value: dict, allowed: set[str], label: str) -> None:
    extra = sorted(set(value) - allowed)
    if extra:
        raise RequestError(
            f"{label} has fields caidllm does not know: {', '.join(extra)}", label.split(".")[0]
        )
