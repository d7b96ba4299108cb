"""BIG-Bench Hard: any ``bbh/<task>.json`` holding {"examples": [{"input", "target"}]},
or, without a data folder, the task's hub copy (sources.py: one row per example).

Zero-shot prompts are the BBH input exactly (the chat template wraps it).
With few-shot K, the first K examples of the file are shown as
"Q: ... / A: So the answer is X." pairs and are not evaluated.

Scoring: exact match of the extracted answer (the last "the answer is X",
else the last line) with the target, ignoring case, a trailing "." and
surrounding spaces. Multiple-choice targets such as "(A)" also accept "A",
"(A)" and "(A) <option text>". Dyck-language answers ignore whitespace.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from caidllm.bench.tasks.base import BenchTask, Sample, Scored, final_answer, take
from caidllm.bench.tasks.sources import load_from_hub
from caidllm.errors import InputError

_CHOICE_TARGET = re.compile(r"^\(([A-Z])\)$")
_CHOICE_ANSWER = re.compile(r"^\(?([A-Z])\)?(?=$|[\s.:,)])")


def normalise(answer: str, task: str) -> str:
    answer = " ".join(answer.split()).lower()
    while answer.endswith("."):
        answer = answer[:-1].rstrip()
    if task == "dyck_languages":
        answer = answer.replace(" ", "")
    return answer


def matches(answer: str | None, target: str, task: str = "") -> bool:
    if answer is None:
        return False
    choice = _CHOICE_TARGET.match(target.strip())
    if choice:
        got = _CHOICE_ANSWER.match(answer.strip())
        return bool(got) and got.group(1) == choice.group(1)
    return normalise(answer, task) == normalise(target, task)


def score_text(text: str, target: str, task: str = "") -> Scored:
    answer = final_answer(text)
    return Scored(score=float(matches(answer, target, task)), extracted=answer)


def available(data_dir: Path) -> list[str]:
    folder = data_dir / "bbh"
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def read_examples(path: Path, what: str) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{what}: cannot read {path}: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{what}: {path} line {e.lineno} is not valid JSON: {e.msg}") from None
    examples = data.get("examples") if isinstance(data, dict) else None
    if not isinstance(examples, list) or not examples:
        raise InputError(f'{what}: {path} must be a JSON object with a non-empty "examples" list')
    for i, ex in enumerate(examples):
        if not (
            isinstance(ex, dict) and isinstance(ex.get("input"), str) and isinstance(ex.get("target"), str)
        ):
            line = _line_of_example(text, i)
            raise InputError(
                f'{what}: {path} example {i} (line {line}) must be an object with string "input" '
                f'and "target", got {ex!r:.80}'
            )
    return examples


def _line_of_example(text: str, index: int) -> int:
    """Line on which the index-th element of the "examples" array starts."""
    decoder = json.JSONDecoder()
    pos = text.index("[", text.index('"examples"')) + 1
    for _ in range(index + 1):
        while text[pos] in " \t\r\n,":
            pos += 1
        start = pos
        _, pos = decoder.raw_decode(text, pos)
    return text.count("\n", 0, start) + 1


def build_prompt(question: str, shots: list[dict]) -> str:
    if not shots:
        return question
    parts = [f"Q: {s['input']}\nA: So the answer is {s['target']}." for s in shots]
    parts.append(f"Q: {question}\nA:")
    return "\n\n".join(parts)


def hub_examples(what: str) -> tuple[list[dict], str]:
    rows, where = load_from_hub(what, required=("input", "target"))
    for lineno, ex in rows:
        if not (isinstance(ex["input"], str) and isinstance(ex["target"], str)):
            raise InputError(
                f'{what}: {where} line {lineno} must have string "input" and "target", got {ex!r:.80}'
            )
    return [ex for _, ex in rows], where


def load(data_dir: Path | None, name: str, limit: int | None, fewshot: int) -> BenchTask:
    what = f"bbh:{name}"
    if "/" in name:
        raise InputError(f"{what}: a BBH task name has no '/'")
    if data_dir is None:
        examples, path = hub_examples(what)
    else:
        path = data_dir / "bbh" / f"{name}.json"
        if not path.is_file():
            names = available(data_dir)
            raise InputError(
                f"{what}: no data file {path}; BBH tasks in {data_dir / 'bbh'}: "
                f"{', '.join(names) if names else 'none'}"
            )
        examples = read_examples(path, what)
    shots, chosen = take(list(enumerate(examples)), limit, fewshot, what)
    shot_examples = [ex for _, ex in shots]
    samples = [
        Sample(id=f"{what}/{i}", prompt=build_prompt(ex["input"], shot_examples), reference=ex["target"])
        for i, ex in chosen
    ]
    return BenchTask(
        name=what,
        metric="exact_match",
        samples=samples,
        scorer=lambda text, s: score_text(text, s.reference, name),
        source=str(path),
        fewshot=fewshot,
    )
