"""The JSON-extraction and regex prompts of the structured-output measurements (BENCHMARKS.md,
benchmarks/structured_validity.py, benchmarks/constraint_libraries.py): ten JSON schemas (nested objects,
arrays, enums, numbers, strings with patterns), each with a valid example, and five regular expressions."""

from __future__ import annotations

import json
import re

import jsonschema

from caidllm.bench.tasks.base import BenchTask, Sample, Scored
from caidllm.decode.constraints import Constraint

DEFAULT_N = 200

SCHEMAS: dict[str, tuple[dict, object]] = {
    "person": (
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Ada", "age": 36},
    ),
    "point": (
        {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        {"x": 1.5, "y": -2},
    ),
    "flags": (
        {
            "type": "object",
            "properties": {"valid": {"type": "boolean"}, "done": {"type": "boolean"}},
            "required": ["valid", "done"],
            "additionalProperties": False,
        },
        {"valid": True, "done": False},
    ),
    "colour": (
        {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green", "blue"]}, "shade": {"enum": [1, 2, 3]}},
            "required": ["colour", "shade"],
            "additionalProperties": False,
        },
        {"colour": "red", "shade": 2},
    ),
    "numbers": (
        {
            "type": "object",
            "properties": {
                "values": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4}
            },
            "required": ["values"],
            "additionalProperties": False,
        },
        {"values": [3, 4]},
    ),
    "date": (
        {
            "type": "object",
            "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
            "required": ["date"],
            "additionalProperties": False,
        },
        {"date": "2024-05-01"},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "admin": {"type": "boolean"}},
                    "required": ["id", "admin"],
                    "additionalProperties": False,
                }
            },
            "required": ["user"],
            "additionalProperties": False,
        },
        {"user": {"id": 7, "admin": False}},
    ),
    "answer": (
        {
            "type": "object",
            "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["cm", "kg", "s"]}},
            "required": ["answer", "unit"],
            "additionalProperties": False,
        },
        {"answer": 12, "unit": "kg"},
    ),
    "tags": (
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
            "required": ["tags"],
            "additionalProperties": False,
        },
        {"tags": ["a", "c"]},
    ),
    "code": (
        {
            "type": "object",
            "properties": {
                "code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                "count": {"type": "integer"},
            },
            "required": ["code", "count"],
            "additionalProperties": False,
        },
        {"code": "ABC12", "count": 5},
    ),
}

REGEXES: dict[str, tuple[str, str]] = {
    "yes_no": (r"(yes|no)", "yes"),
    "sum": (r"[0-9]{1,3} \+ [0-9]{1,3} = [0-9]{1,4}", "3 + 4 = 7"),
    "sentence": (r"The answer is (True|False)\.", "The answer is True."),
    "list": (r"\[[0-9]( , [0-9]){0,4}\]", "[1 , 2]"),
    "phone": (r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", "(555) 123-4567"),
}


def schema_prompt(name: str) -> str:
    return f"Give a {name} as JSON."


def regex_prompt(name: str) -> str:
    return f"Answer in the {name.replace('_', ' ')} format."


def _cases(count: int) -> list[tuple[str, str]]:
    """(kind, name) cycling over the schemas (three times each per round) and the regexes."""
    kinds = [("schema", name) for name in SCHEMAS] * 3 + [("regex", name) for name in REGEXES]
    return [kinds[i % len(kinds)] for i in range(count)]


def constraint_of(case: tuple[str, str]) -> Constraint:
    kind, name = case
    return (
        Constraint("json_schema", SCHEMAS[name][0])
        if kind == "schema"
        else Constraint("regex", REGEXES[name][0])
    )


def score_text(text: str, case: tuple[str, str]) -> Scored:
    """1 when the answer parses and validates against its schema (jsonschema), or matches its regex."""
    kind, name = case
    if kind == "regex":
        return Scored(float(re.fullmatch(REGEXES[name][0], text) is not None), text)
    try:
        jsonschema.validate(json.loads(text), SCHEMAS[name][0])
        return Scored(1.0, text)
    except (ValueError, jsonschema.ValidationError) as error:
        return Scored(0.0, text, {"why": str(error)[:200]})


def load(limit: int | None, constrained: bool = True) -> BenchTask:
    """The JSON-extraction task: 200 prompts by default (ten schemas and five regexes), each answer held to
    its own constraint (`json-extraction`) or not (`json-extraction:free`); the score is validity."""
    cases = _cases(DEFAULT_N if limit is None else limit)
    prompt = {"schema": schema_prompt, "regex": regex_prompt}
    samples = [
        Sample(
            id=f"json-extraction/{i}",
            prompt=prompt[kind](name) + ("" if i < len(SCHEMAS) * 3 + len(REGEXES) else f" ({i})"),
            reference=(kind, name),
        )
        for i, (kind, name) in enumerate(cases)
    ]
    return BenchTask(
        name="json-extraction" if constrained else "json-extraction:free",
        metric="valid",
        samples=samples,
        scorer=lambda text, s: score_text(text, s.reference),
        source="caidllm.bench.tasks.structured",
        constraint_for=(lambda s: constraint_of(s.reference)) if constrained else None,
        notes="validity: the answer parses and validates against its JSON schema, or matches its regex",
    )
