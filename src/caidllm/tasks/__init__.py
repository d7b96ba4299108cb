"""Synthetic task families (BBH-format inputs, worked answers) and scoring.

from caidllm.tasks import TASK_NAMES, get_task, extract_answer, score
task = get_task("navigate")
ex = task.example(seed=0)                 # Example(prompt, answer, target, task)
exs = task.examples("train", n=100, seed=0)
score("navigate", ex.answer, ex.target)   # True
"""

from __future__ import annotations

from collections.abc import Iterator

from caidllm.tasks.base import FINAL_PREFIX, SPLITS, Example, Task, split_of
from caidllm.tasks.registry import (
    CHOICE_NAMES,
    COT_NAMES,
    DRILL_NAMES,
    TASK_NAMES,
    check_task,
    get_task,
    get_training_task,
)
from caidllm.tasks.scoring import extract_answer, normalise, score


def corpus_texts(n_per_task: int, seed: int = 0, tasks: tuple[str, ...] = TASK_NAMES) -> Iterator[str]:
    """Prompt + "\\n" + answer strings, ``n_per_task`` per task (train
    split), e.g. for building the tokenizer vocabulary."""
    for name in tasks:
        for ex in get_task(name).examples("train", n_per_task, seed):
            yield ex.prompt + "\n" + ex.answer


__all__ = [
    "TASK_NAMES",
    "DRILL_NAMES",
    "COT_NAMES",
    "CHOICE_NAMES",
    "SPLITS",
    "FINAL_PREFIX",
    "Example",
    "Task",
    "get_task",
    "get_training_task",
    "check_task",
    "extract_answer",
    "normalise",
    "score",
    "split_of",
    "corpus_texts",
]
