"""What every benchmark task is made of: samples, a scorer, file readers.

A task turns a data file into `Sample`s (an id, the user message, and what
the scorer needs) and scores one generated text against one sample,
returning a `Scored` (a score in [0, 1], the extracted answer, details).
Readers raise `InputError` naming the file and the line of a bad record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caidllm.errors import InputError

CONTEXT_SLOT = "\x00CONTEXT\x00"  # where a long context goes in Sample.template


@dataclass
class Sample:
    id: str
    prompt: str  # the user message (the chat template is applied by the runner)
    reference: Any  # whatever the scorer needs (target string, tests, answers...)
    context: str | None = None  # a long context that may be cut in the middle to fit the model
    template: str | None = None  # the prompt with CONTEXT_SLOT in place of `context`

    def render(self, context: str | None = None) -> str:
        """The prompt, with `context` in place of the full context if given."""
        if self.template is None:
            return self.prompt
        return self.template.replace(CONTEXT_SLOT, self.context if context is None else context)


@dataclass
class Scored:
    score: float  # 1.0 / 0.0 for exact match and pass@1; F1 / ROUGE-L in [0, 1]
    extracted: str | None  # the answer taken from the text (code: the program's status)
    details: dict = field(default_factory=dict)  # extra per-sample metrics and diagnostics

    @property
    def correct(self) -> bool:
        return self.score >= 1.0


@dataclass
class BenchTask:
    name: str  # the --task spec, e.g. "bbh:boolean_expressions"
    metric: str  # exact_match | pass@1 | f1 | rougeL | f1/rougeL
    samples: list[Sample]
    scorer: Callable[[str, Sample], Scored]
    source: str  # the file (or package) the samples came from
    fewshot: int = 0  # examples shown in each prompt (taken from the data, excluded from evaluation)
    extra_metrics: tuple[str, ...] = ()  # keys of Scored.details averaged over samples (e.g. "flexible")
    notes: str = ""
    # Structured output: each sample's constraint (decode/constraints/), held while decoding; None: none.
    constraint_for: Callable[[Sample], object] | None = None

    def score(self, text: str, sample: Sample) -> Scored:
        return self.scorer(text, sample)


def _check_file(path: Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"{what}: data file {path} does not exist")
    if not path.is_file():
        raise InputError(f"{what}: {path} is not a file")
    return path


def read_jsonl(path, what: str, required: Iterable[str] = ()) -> list[tuple[int, dict]]:
    """(line number, record) for every non-blank line of a JSON-lines file;
    InputError naming the file and line of a record that is not a JSON object
    or lacks a required field."""
    path = _check_file(path, what)
    required = tuple(required)
    records = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{what}: cannot read {path}: {e}") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{what}: {path} line {lineno} is not valid JSON: {e.msg}") from None
        if not isinstance(record, dict):
            raise InputError(
                f"{what}: {path} line {lineno} is a JSON {type(record).__name__}, expected an object"
            )
        missing = [k for k in required if k not in record]
        if missing:
            raise InputError(
                f"{what}: {path} line {lineno} lacks field(s) {', '.join(map(repr, missing))} "
                f"(has {', '.join(map(repr, record)) or 'none'})"
            )
        records.append((lineno, record))
    if not records:
        raise InputError(f"{what}: {path} has no records")
    return records


def read_json_or_jsonl(path, what: str, required: Iterable[str] = ()) -> list[tuple[int, dict]]:
    """JSON lines, or one JSON array of objects (line numbers are then the
    line where each object starts)."""
    path = _check_file(path, what)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{what}: cannot read {path}: {e}") from None
    if not text.lstrip().startswith("["):
        return read_jsonl(path, what, required)
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{what}: {path} line {e.lineno} is not valid JSON: {e.msg}") from None
    decoder = json.JSONDecoder()
    starts, pos = [], text.index("[") + 1
    for _ in items:  # find where each element starts, for line numbers in errors
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        starts.append(text.count("\n", 0, pos) + 1)
        _, pos = decoder.raw_decode(text, pos)
    required = tuple(required)
    records = []
    for lineno, item in zip(starts, items):
        if not isinstance(item, dict):
            raise InputError(
                f"{what}: {path} line {lineno}: element is a JSON {type(item).__name__}, expected an object"
            )
        missing = [k for k in required if k not in item]
        if missing:
            raise InputError(f"{what}: {path} line {lineno} lacks field(s) {', '.join(map(repr, missing))}")
        records.append((lineno, item))
    if not records:
        raise InputError(f"{what}: {path} has no records")
    return records


def field_of(record: dict, key: str, kind, path, lineno: int, what: str):
    """record[key], checked to be of `kind`; InputError naming file and line."""
    value = record.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InputError(f"{what}: {path} line {lineno}: field {key!r} must be {names}, got {value!r:.60}")
    return value


def take(items: list, limit: int | None, fewshot: int, what: str) -> tuple[list, list]:
    """(few-shot examples, evaluation examples): the first `fewshot` items are
    the shots and are never evaluated; then at most `limit` items."""
    if fewshot >= len(items):
        raise InputError(
            f"{what}: --fewshot {fewshot} leaves no example to evaluate ({len(items)} in the data)"
        )
    shots, rest = items[:fewshot], items[fewshot:]
    return shots, rest if limit is None else rest[:limit]


# ---- answer extraction shared by the tasks ----------------------------------

_ANSWER_IS = re.compile(r"the (?:final )?answer is[ \t]*:?[ \t]*([^\n]*)", re.IGNORECASE)


def clean_answer(text: str) -> str:
    text = text.strip()
    for wrapper in ("**", "`", '"', "'"):
        if len(text) > 2 * len(wrapper) and text.startswith(wrapper) and text.endswith(wrapper):
            text = text[len(wrapper) : -len(wrapper)].strip()
    while text.endswith("."):
        text = text[:-1].rstrip()
    return text.strip("*` ").strip()


def final_answer(text: str) -> str | None:
    """The answer in a generated text: the last "the answer is X" (X up to the
    end of its line); without one, the last non-empty line. None if empty."""
    if not isinstance(text, str):
        return None
    matches = _ANSWER_IS.findall(text)
    if matches:
        answer = clean_answer(matches[-1])
        if answer:
            return answer
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    return clean_answer(lines[-1]) or None


def normalise_text(text: str) -> str:
    """Lower case, inner whitespace collapsed, surrounding punctuation removed."""
    text = " ".join(text.lower().split())
    return text.strip(" .,;:!?\"'()[]")
