"""PIQA and WinoGrande as generation tasks.

The prompt lists the two options, numbered 1 and 2, and asks for the
number. The model's answer (the last "the answer is X", else the last line)
is correct when it names the right option: its number ("2", "(2)",
"Option 2", "2. <text>") or its text (exact, ignoring case, spaces and
surrounding punctuation).
"""

from __future__ import annotations

import re
from pathlib import Path

from caidllm.bench.tasks.base import BenchTask, Sample, Scored, field_of, final_answer, normalise_text, take
from caidllm.bench.tasks.sources import task_records
from caidllm.errors import InputError

_NUMBER = re.compile(r"^(?:option|solution|answer|choice)?\s*\(?([12])\)?(?=$|[\s.:,)])", re.IGNORECASE)


def chosen_option(answer: str | None, options: list[str]) -> int | None:
    """Index (0-based) of the option the answer names, or None."""
    if answer is None:
        return None
    got = _NUMBER.match(answer.strip())
    if got:
        return int(got.group(1)) - 1
    norm = normalise_text(answer)
    hits = [i for i, option in enumerate(options) if normalise_text(option) == norm]
    return hits[0] if len(hits) == 1 else None


def score_choice(text: str, options: list[str], correct: int) -> Scored:
    answer = final_answer(text)
    choice = chosen_option(answer, options)
    return Scored(
        score=float(choice == correct),
        extracted=answer,
        details={"choice": None if choice is None else choice + 1},
    )


def _samples(records, make) -> list[Sample]:
    return [make(lineno, r) for lineno, r in records]


def load_piqa(data_dir: Path | None, limit: int | None) -> BenchTask:
    """From DATA/piqa/validation.jsonl, or the hub copy without a data folder (sources.py)."""
    records, path = task_records("piqa", data_dir, required=("goal", "sol1", "sol2", "label"))

    def make(lineno, r):
        goal, sol1, sol2 = (field_of(r, k, str, path, lineno, "piqa") for k in ("goal", "sol1", "sol2"))
        label = r["label"]
        if label not in (0, 1, "0", "1") or isinstance(label, bool):
            raise InputError(f"piqa: {path} line {lineno}: label must be 0 or 1, got {label!r}")
        prompt = (
            f"Goal: {goal}\nWhich solution is better?\n1. {sol1}\n2. {sol2}\n"
            "Answer with the number of the better solution (1 or 2)."
        )
        return Sample(id=f"piqa/{lineno}", prompt=prompt, reference=([sol1, sol2], int(label)))

    _, chosen = take(records, limit, 0, "piqa")
    return BenchTask(
        name="piqa",
        metric="exact_match",
        samples=_samples(chosen, make),
        scorer=lambda text, s: score_choice(text, *s.reference),
        source=path,
    )


def load_winogrande(data_dir: Path | None, limit: int | None) -> BenchTask:
    """From DATA/winogrande/validation.jsonl, or the hub copy without a data folder (sources.py)."""
    records, path = task_records(
        "winogrande", data_dir, required=("sentence", "option1", "option2", "answer")
    )

    def make(lineno, r):
        sentence, o1, o2 = (
            field_of(r, k, str, path, lineno, "winogrande") for k in ("sentence", "option1", "option2")
        )
        answer = str(r["answer"])
        if answer not in ("1", "2"):
            raise InputError(
                f'winogrande: {path} line {lineno}: answer must be "1" or "2", got {r["answer"]!r}'
            )
        prompt = (
            f"{sentence}\nWhat does the blank _ refer to?\n1. {o1}\n2. {o2}\n"
            "Answer with the number of the right option (1 or 2)."
        )
        return Sample(id=f"winogrande/{lineno}", prompt=prompt, reference=([o1, o2], int(answer) - 1))

    _, chosen = take(records, limit, 0, "winogrande")
    return BenchTask(
        name="winogrande",
        metric="exact_match",
        samples=_samples(chosen, make),
        scorer=lambda text, s: score_choice(text, *s.reference),
        source=path,
    )
