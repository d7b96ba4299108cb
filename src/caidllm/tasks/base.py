"""Shared pieces of the synthetic task families: Example, seeding, splits.

Every family is a function ``generate(rng) -> (prompt, answer, target)``.
``Task`` wraps it with deterministic seeding and split assignment.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from caidllm.errors import InputError

SPLITS = ("train", "validation", "test")
# Share of the canonical input space owned by each split, in 1/1000.
_SPLIT_BOUNDS = (("train", 800), ("validation", 900), ("test", 1000))
FINAL_PREFIX = "So the answer is "
# How the task tokenizer cuts text (see vocab.py): newline | word with its
# leading space | one punctuation mark with its leading space | one digit |
# other whitespace.  Every piece of task text is one token.
PIECE_PATTERN = r"\n| ?[A-Za-z]+| ?[^\sA-Za-z0-9]|[0-9]|[^\S\n]+"
# Answers are generated in a 256-token canvas; keep worked answers (plus
# the end-of-turn tokens) well inside it.  Longer ones are redrawn, which
# only trims the extreme tail (< 0.01% of draws).
MAX_ANSWER_TOKENS = 176


@dataclass(frozen=True)
class Example:
    prompt: str  # user message text (for BBH families: exactly the BBH input)
    answer: str  # worked answer, last line "So the answer is X."
    target: str  # X, exactly the BBH target string
    task: str


def stable_int(*parts: object) -> int:
    """A 64-bit integer from the parts, equal on every run and machine
    (Python's hash() is salted per process, so it cannot be used)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(task: str, prompt: str) -> str:
    """The one split an input belongs to, decided by its text alone, so no
    prompt can ever appear in two splits whatever seeds are used."""
    bucket = stable_int("split", task, prompt) % 1000
    for name, bound in _SPLIT_BOUNDS:
        if bucket < bound:
            return name
    raise AssertionError("unreachable")


def count_tokens(text: str) -> int:
    """Token count of task text under the task tokenizer."""
    return len(re.findall(PIECE_PATTERN, text))


def final_line(target: str) -> str:
    return f"{FINAL_PREFIX}{target}."


Generator = Callable[[random.Random], "tuple[str, str, str]"]


class Task:
    """One task family: deterministic examples and disjoint splits."""

    # Redraws allowed per requested example; a split owns >= 10% of the
    # input space, so running out means the generator is broken.
    _MAX_TRIES = 1000

    def __init__(
        self,
        name: str,
        generate: Generator,
        words: Collection[str] = (),
        max_answer_tokens: int = MAX_ANSWER_TOKENS,
        split_key: str | None = None,
    ):
        self.name = name
        self._generate = generate
        self.words = tuple(words)  # task vocabulary, for the tokenizer
        self.max_answer_tokens = max_answer_tokens
        # A variant of a family (its inputs, other worked answers) shares the family's
        # split of the input space, so no test input of one is a training input of the other.
        self.split_key = split_key or name

    def _make(self, rng: random.Random) -> Example:
        for _ in range(self._MAX_TRIES):
            prompt, answer, target = self._generate(rng)
            if count_tokens(answer) <= self.max_answer_tokens:
                return Example(prompt=prompt, answer=answer, target=target, task=self.name)
        raise RuntimeError(f"{self.name}: every worked answer was over {self.max_answer_tokens} tokens")

    def example(self, seed: int) -> Example:
        """One example from the whole distribution (any split)."""
        return self._make(random.Random(stable_int(self.name, "example", seed)))

    def examples(
        self,
        split: str,
        n: int,
        seed: int = 0,
        exclude: Collection[str] | None = None,
    ) -> list[Example]:
        """``n`` examples of ``split``; same arguments, same list.

        Example ``i`` is drawn from a seed made of (task, split, seed, i,
        try) and redrawn until its prompt belongs to ``split``.  Prompts in
        ``exclude`` (e.g. evaluation inputs) are redrawn too.
        """
        if split not in SPLITS:
            raise InputError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"n must be an integer >= 1, got {n!r}")
        out = []
        for i in range(n):
            for attempt in range(self._MAX_TRIES):
                rng = random.Random(stable_int(self.name, split, seed, i, attempt))
                ex = self._make(rng)
                if split_of(self.split_key, ex.prompt) != split:
                    continue
                if exclude and ex.prompt in exclude:
                    continue
                out.append(ex)
                break
            else:
                raise RuntimeError(f"{self.name}: no {split} example after {self._MAX_TRIES} draws")
        return out
