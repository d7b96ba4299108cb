"""The task families by name: the benchmark families and the training-only drills."""

from __future__ import annotations

from caidllm.errors import InputError
from caidllm.tasks import (
    arithmetic,
    arithmetic_facts,
    boolean_expressions,
    cot_styles,
    dyck_languages,
    multistep_arithmetic_two,
    navigate,
    tracking_shuffled_objects,
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
# The long worked answers of `tiny-cot` (100-400 tokens): tracking_shuffled_objects, new to
# caidllm, and "cot" variants of four families. Apart from TASK_NAMES so that `tiny`'s
# tokenizer corpus, validation and recorded outputs stay as they were.
COT_MAX_ANSWER_TOKENS = 400
_COT_TASKS = {
    f"tracking_shuffled_objects_{count}_objects": Task(
        f"tracking_shuffled_objects_{count}_objects",
        tracking_shuffled_objects.generator(count),
        tracking_shuffled_objects.task_words(),
        COT_MAX_ANSWER_TOKENS,
    )
    for count in tracking_shuffled_objects.COUNTS
}
_COT_TASKS.update(
    {
        name: Task(name, generate, cot_styles.WORDS, COT_MAX_ANSWER_TOKENS, split_key=family)
        for name, (generate, family) in cot_styles.GENERATORS.items()
    }
)
COT_NAMES = tuple(_COT_TASKS)
# Multiple-choice tasks: the target is a letter in parentheses, "(B)".
CHOICE_NAMES = tuple(name for name in COT_NAMES if name.startswith("tracking_shuffled_objects"))
_ALL = {**_TASKS, **_COT_TASKS}


def check_task(name: str) -> str:
    if name not in _ALL:
        raise InputError(f"unknown task {name!r}; choose one of {', '.join(_ALL)}")
    return name


def get_task(name: str) -> Task:
    return _ALL[check_task(name)]


def family_of(name: str) -> str:
    """The family a task's answers are scored as (a cot variant: its family's)."""
    return get_task(name).split_key


def get_training_task(name: str) -> Task:
    """A benchmark family or a training-only drill."""
    if name in _DRILLS:
        return _DRILLS[name]
    if name not in _ALL:
        raise InputError(
            f"unknown training task {name!r}; choose from {', '.join(TASK_NAMES + COT_NAMES + DRILL_NAMES)}"
        )
    return _ALL[name]
