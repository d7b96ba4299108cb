"""Training-only drill: the arithmetic facts the worked chains of
`arithmetic` and `navigate` rely on, eight to an example.

The tiny model copies the operands of a chain line right (``4 * 8 =``) but
gets its result wrong (``22``): it has seen too few of the facts. A chain
example teaches one or two facts; a drill example teaches eight, in exactly
the form of a chain line, so the facts carry over. Not a benchmark family
(not in ``TASK_NAMES``): it is never evaluated.

    prompt: 4 * 8, 17 + 6, 42 - 15, 36 / 4, ...
    answer: 4 * 8 = 32
            17 + 6 = 23
            ...
"""

from __future__ import annotations

import random

FACTS_PER_EXAMPLE = 8


def _fact(rng: random.Random) -> tuple[int, str, int, int]:
    kind = rng.randrange(5)
    if kind == 0:  # the step counts of navigate and small sums
        a, b = rng.randint(1, 10), rng.randint(1, 10)
        return a, "+", b, a + b
    if kind == 1:  # running sums and word-problem totals
        a, b = rng.randint(1, 70), rng.randint(1, 20)
        return a, "+", b, a + b
    if kind == 2:
        a = rng.randint(2, 100)
        b = rng.randint(1, min(a - 1, 40))
        return a, "-", b, a - b
    if kind == 3:
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        return (a, "*", b, a * b) if rng.random() < 0.5 else (b, "*", a, a * b)
    b, q = rng.randint(2, 9), rng.randint(2, 12)
    return b * q, "/", b, q


def generate(rng: random.Random) -> tuple[str, str, str]:
    facts = [_fact(rng) for _ in range(FACTS_PER_EXAMPLE)]
    prompt = ", ".join(f"{a} {op} {b}" for a, op, b, _ in facts)
    answer = "\n".join(f"{a} {op} {b} = {c}" for a, op, b, c in facts)
    return prompt, answer, str(facts[-1][3])  # a target only to fit the Task interface: drills are never scored
