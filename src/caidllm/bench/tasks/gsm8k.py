"""GSM8K: exact match on the final number.

Two extractions, as lm-eval's gsm8k tasks: *strict* takes the number after
"#### " or after "The answer is" (the first such match), *flexible* takes the
last number anywhere in the text. Strict is the task's accuracy; flexible is
reported beside it. Numbers are compared after removing "$", thousands
separators and a trailing ".", and as numbers (so "18.00" equals "18").
"""

from __future__ import annotations

import re
from pathlib import Path

from caidllm.bench.tasks.base import BenchTask, Sample, Scored, field_of, take
from caidllm.bench.tasks.sources import task_records
from caidllm.errors import InputError

_STRICT = (
    re.compile(r"#### ?(\$?-?[0-9.,]*[0-9])"),
    re.compile(r"the (?:final )?answer is:?\s*\$?\s*(-?[0-9.,]*[0-9])", re.IGNORECASE),
)
_ANY_NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # lm-eval's flexible-extract pattern

INSTRUCTION = (
    'Solve the problem step by step. End with the line "The answer is N." where N is the final number.'
)


def normalise_number(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.replace("$", "").replace(",", "").strip()
    while text.endswith("."):
        text = text[:-1]
    return text or None


def same_number(a: str | None, b: str | None) -> bool:
    a, b = normalise_number(a), normalise_number(b)
    if a is None or b is None:
        return False
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def extract_strict(text: str) -> str | None:
    for pattern in _STRICT:
        match = pattern.search(text)
        if match:
            return normalise_number(match.group(1))
    return None


def extract_flexible(text: str) -> str | None:
    numbers = [a or b for a, b in _ANY_NUMBER.findall(text)]
    numbers = [n for n in numbers if any(ch.isdigit() for ch in n)]
    return normalise_number(numbers[-1]) if numbers else None


def gold_answer(solution: str) -> str:
    return normalise_number(solution.split("####")[-1]) or ""


def score_text(text: str, target: str) -> Scored:
    strict, flexible = extract_strict(text), extract_flexible(text)
    return Scored(
        score=float(same_number(strict, target)),
        extracted=strict,
        details={"flexible": float(same_number(flexible, target)), "extracted_flexible": flexible},
    )


def build_prompt(question: str, shots: list[dict]) -> str:
    if not shots:
        return f"{question}\n{INSTRUCTION}"
    parts = [f"Question: {s['question']}\nAnswer: {s['answer']}" for s in shots]
    parts.append(f"Question: {question}\nAnswer:")
    return "\n\n".join(parts)


def load(data_dir: Path | None, limit: int | None, fewshot: int) -> BenchTask:
    """From DATA/gsm8k/test.jsonl, or the hub copy without a data folder (sources.py)."""
    records, path = task_records("gsm8k", data_dir, required=("question", "answer"))
    for lineno, r in records:
        field_of(r, "question", str, path, lineno, "gsm8k")
        field_of(r, "answer", str, path, lineno, "gsm8k")
        if "####" not in r["answer"]:
            raise InputError(f"gsm8k: {path} line {lineno}: answer has no '#### N' final line")
    shots, chosen = take(records, limit, fewshot, "gsm8k")
    shot_records = [r for _, r in shots]
    samples = [
        Sample(
            id=f"gsm8k/{lineno}",
            prompt=build_prompt(r["question"], shot_records),
            reference=gold_answer(r["answer"]),
        )
        for lineno, r in chosen
    ]
    return BenchTask(
        name="gsm8k",
        metric="exact_match",
        samples=samples,
        scorer=lambda text, s: score_text(text, s.reference),
        source=path,
        fewshot=fewshot,
        extra_metrics=("flexible",),
        notes="accuracy = strict match ('#### N' / 'The answer is N'); "
        "accuracy_flexible = last number in the text",
    )
