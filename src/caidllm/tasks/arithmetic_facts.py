"""Training-only drill: the arithmetic facts the worked chains rely on,
twelve to an example, each written exactly as a chain writes it.

The chains of `arithmetic` reduce every sum and difference to one column
at a time (``7 + 5 = 12``, then the tens with the carry ``4 + 3 + 1 = 8``)
and every product or quotient to the times table; `navigate` adds step
counts of at most 10 to a running sum (``23 + 9 = 32``). So the facts a
model needs are few (1,116) and each is drilled here many times over,
from the first step of training. Not a benchmark family (not in
``TASK_NAMES``): it is never evaluated, and its text uses no new tokens.

    prompt: 4 * 8, 7 + 5, 12 - 7, 4 - 1 - 1, 23 + 9, ...
    answer: 4 * 8 = 32
            7 + 5 = 12
            ...
"""

from __future__ import annotations

import random

from caidllm.tasks.arithmetic import OPERATIONS, borrowed

FACTS_PER_EXAMPLE = 12
DIGITS = range(10)


# Each kind of fact, as the left-hand sides a chain writes.
KINDS: dict[str, list[str]] = {
    "units sum": [f"{a} + {b}" for a in DIGITS for b in DIGITS],  # also every one-digit sum
    "tens sum with carry": [f"{a} + {b} + 1" for a in DIGITS for b in DIGITS],
    # also every one-digit difference
    "units difference": [f"{borrowed(a, b)} - {b}" for a in DIGITS for b in DIGITS],
    "tens difference with borrow": [f"{a} - {b} - 1" for a in DIGITS for b in DIGITS if a > b],
    "product": [f"{a} * {b}" for a in range(1, 10) for b in range(1, 10)],
    "quotient": [f"{a * b} / {b}" for a in range(1, 10) for b in range(1, 10)],
    "running sum": [f"{total} + {step}" for total in range(1, 70) for step in range(1, 11)],  # navigate
}
# The running sums are about seven times as many facts as any other kind: drawn three times as often.
KIND_WEIGHTS = {kind: 3.0 if kind == "running sum" else 1.0 for kind in KINDS}


def value_of(lhs: str) -> int:
    """ "4 - 1 - 1" -> 2: left to right (every fact has one kind of operator)."""
    first, *rest = lhs.split()
    value = int(first)
    for op, number in zip(rest[::2], rest[1::2]):
        value = OPERATIONS[op](value, int(number))
    return value


def fact_space() -> set[str]:
    """Every left-hand side the drill can draw."""
    return {lhs for facts in KINDS.values() for lhs in facts}


def generate(rng: random.Random) -> tuple[str, str, str]:
    kinds = rng.choices(list(KINDS), weights=list(KIND_WEIGHTS.values()), k=FACTS_PER_EXAMPLE)
    facts = [rng.choice(KINDS[kind]) for kind in kinds]
    values = [value_of(lhs) for lhs in facts]
    answer = "\n".join(f"{lhs} = {value}" for lhs, value in zip(facts, values))
    # a target only to fit the Task interface: drills are never scored
    return (
        ", ".join(facts),
        answer,
        str(values[-1]),
    )
