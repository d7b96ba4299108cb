"""Synthetic task families (BBH-format inputs, worked answers) and scoring.

    from caidllm.tasks import TASK_NAMES, get_task, extract_answer, score
    task = get_task("navigate")
    ex = task.example(seed=0)                 # Example(prompt, answer, target, task)
    exs = task.examples("train", n=100, seed=0)
    score("navigate", ex.answer, ex.target)   # True
"""

from __future__ import annotations

from typing import Iterator

from caidllm.errors import InputError
from caidllm.tasks import (
    arithmetic,
    arithmetic_facts,
    boolean_expressions,
    dyck_languages,
    multistep_arithmetic_two,
    navigate,
    web_of_lies,
)
from caidllm.tasks.base import FINAL_PREFIX, SPLITS, Example, Task, split_of
from caidllm.tasks.scoring import extract_answer, normalise, score

_MODULES = {
    "boolean_expressions": boolean_expressions,
    "web_of_lies": web_of_lies,
    "navigate": navigate,
    "dyck_languages": dyck_languages,
    "multistep_arithmetic_two": multistep_arithmetic_two,
    "arithmetic": arithmetic,
}
TASK_NAMES = tuple(_MODULES)  # the benchmark families: evaluated, scored, in the tokenizer's corpus
# Training-only drills: the trainer may draw batches from them, nothing evaluates them.
_DRILL_MODULES = {"arithmetic_facts": arithmetic_facts}
DRILL_NAMES = tuple(_DRILL_MODULES)
_TASKS = {name: Task(name, mod.generate, getattr(mod, "WORDS", ())) for name, mod in _MODULES.items()}
_DRILLS = {name: Task(name, mod.generate) for name, mod in _DRILL_MODULES.items()}


def check_task(name: str) -> str:
    if name not in _TASKS:
        raise InputError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    return name


def get_task(name: str) -> Task:
    return _TASKS[check_task(name)]


def get_training_task(name: str) -> Task:
    """A benchmark family or a training-only drill."""
    if name in _DRILLS:
        return _DRILLS[name]
    if name not in _TASKS:
        raise InputError(f"unknown training task {name!r}; choose from {', '.join(TASK_NAMES + DRILL_NAMES)}")
    return _TASKS[name]


def corpus_texts(n_per_task: int, seed: int = 0, tasks: tuple[str, ...] = TASK_NAMES) -> Iterator[str]:
    """Prompt + "\\n" + answer strings, ``n_per_task`` per task (train
    split), e.g. for building the tokenizer vocabulary."""
    for name in tasks:
        for ex in get_task(name).examples("train", n_per_task, seed):
            yield ex.prompt + "\n" + ex.answer


__all__ = [
    "TASK_NAMES", "DRILL_NAMES", "SPLITS", "FINAL_PREFIX", "Example", "Task", "get_task", "get_training_task", "check_task",
    "extract_answer", "normalise", "score", "split_of", "corpus_texts",
]
