"""The task families by name: the benchmark families and the training-only drills."""

from __future__ import annotations

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
from caidllm.tasks.base import Task

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
