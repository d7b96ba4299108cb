"""The project's synthetic task families (caidllm.tasks): the test split for
benchmarks, the validation split for calibration (disjoint by construction)."""

from __future__ import annotations

from caidllm.bench.tasks.base import BenchTask, Sample, Scored
from caidllm.errors import InputError
from caidllm.tasks import COT_NAMES, TASK_NAMES, extract_answer, get_task, score

DEFAULT_N = 250  # examples when no --limit is given (a BBH task's size)


def score_text(text: str, target: str, task: str) -> Scored:
    return Scored(score=float(score(task, text, target)), extracted=extract_answer(text))


def load(name: str, limit: int | None, seed: int, split: str = "test") -> BenchTask:
    if name not in TASK_NAMES + COT_NAMES:
        raise InputError(
            f"unknown synthetic task {name!r}; choose one of {', '.join(TASK_NAMES + COT_NAMES)}"
        )
    n = DEFAULT_N if limit is None else limit
    examples = get_task(name).examples(split, n, seed=seed)
    tag = "" if split == "test" else f"{split}/"  # test ids stay as they were
    samples = [
        Sample(id=f"synthetic:{name}/{tag}{i}", prompt=ex.prompt, reference=ex.target)
        for i, ex in enumerate(examples)
    ]
    return BenchTask(
        name=f"synthetic:{name}",
        metric="exact_match",
        samples=samples,
        scorer=lambda text, s: score_text(text, s.reference, name),
        source=f"caidllm.tasks.{name} ({split} split, seed {seed})",
    )
