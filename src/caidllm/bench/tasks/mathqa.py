"""MathQA: the test split (``mathqa``: DATA/mathqa/test.jsonl, or the hub
copy without a data folder), or a user file (``mathqa:FILE``); JSON lines, or
the original JSON array, with the MathQA fields: ``Problem``, ``options``
("a ) 38 , b ) 27.675 , ..." or a list of "a ) 38" strings) and ``correct``
(a letter a-e).

The prompt lists the options as "(a) ..." and asks for the letter; an answer
is correct when it names the right letter ("c", "(c)", "c) 30") or the
right option's text.
"""

from __future__ import annotations

import re
from pathlib import Path

from caidllm.bench.tasks.base import (
    BenchTask,
    Sample,
    Scored,
    field_of,
    final_answer,
    normalise_text,
    read_json_or_jsonl,
    take,
)
from caidllm.bench.tasks.sources import task_records
from caidllm.errors import InputError

_OPTION = re.compile(r"([a-e])\s*\)\s*(.*?)\s*(?=(?:,\s*[a-e]\s*\))|$)", re.IGNORECASE | re.DOTALL)
_LETTER = re.compile(r"^(?:option\s*)?\(?([a-e])\)?(?=$|[\s.:,)])", re.IGNORECASE)


def parse_options(options) -> dict[str, str] | None:
    if isinstance(options, list):
        options = " , ".join(str(o) for o in options)
    if not isinstance(options, str):
        return None
    parsed = {m.group(1).lower(): m.group(2).strip() for m in _OPTION.finditer(options)}
    return parsed or None


def chosen_letter(answer: str | None, options: dict[str, str]) -> str | None:
    if answer is None:
        return None
    got = _LETTER.match(answer.strip())
    if got:
        return got.group(1).lower()
    norm = normalise_text(answer)
    hits = [k for k, v in options.items() if normalise_text(v) == norm]
    return hits[0] if len(hits) == 1 else None


def score_text(text: str, options: dict[str, str], correct: str) -> Scored:
    answer = final_answer(text)
    letter = chosen_letter(answer, options)
    return Scored(score=float(letter == correct), extracted=answer, details={"choice": letter})


def build_prompt(problem: str, options: dict[str, str]) -> str:
    listed = "\n".join(f"({k}) {v}" for k, v in sorted(options.items()))
    return f"{problem}\nOptions:\n{listed}\nAnswer with the letter of the correct option."


REQUIRED = ("Problem", "options", "correct")


def load(path: str, limit: int | None, data_dir: Path | None) -> BenchTask:
    """`mathqa:FILE`: a user file (relative paths may also be inside the data folder)."""
    file = Path(path).expanduser()
    if not file.exists() and data_dir is not None and (data_dir / path).exists():
        file = data_dir / path
    what = f"mathqa:{path}"
    return build(what, read_json_or_jsonl(file, what, required=REQUIRED), str(file), limit)


def load_test_split(data_dir: Path | None, limit: int | None) -> BenchTask:
    """`mathqa`: DATA/mathqa/test.jsonl, or the hub copy without a data folder."""
    records, where = task_records("mathqa", data_dir, required=REQUIRED, reader=read_json_or_jsonl)
    return build("mathqa", records, where, limit)


def build(what: str, records: list[tuple[int, dict]], file: str, limit: int | None) -> BenchTask:
    samples = []
    _, chosen = take(records, limit, 0, what)
    for lineno, r in chosen:
        problem = field_of(r, "Problem", str, file, lineno, what)
        options = parse_options(r["options"])
        if options is None:
            raise InputError(
                f"{what}: {file} line {lineno}: cannot read options {r['options']!r:.80} "
                "(expected 'a ) ... , b ) ...' or a list of 'a ) ...' strings)"
            )
        correct = str(r["correct"]).strip().lower()
        if correct not in options:
            raise InputError(
                f"{what}: {file} line {lineno}: correct answer {r['correct']!r} is not one of the "
                f"options {', '.join(sorted(options))}"
            )
        samples.append(
            Sample(id=f"mathqa/{lineno}", prompt=build_prompt(problem, options), reference=(options, correct))
        )
    return BenchTask(
        name=what,
        metric="exact_match",
        samples=samples,
        scorer=lambda text, s: score_text(text, *s.reference),
        source=file,
    )
