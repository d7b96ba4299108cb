"""BBH multistep_arithmetic_two: ``((-1 + 2 + 9 * 5) - (-2 + -4 + -4 * -7)) =``.

Two groups of four integers in -9..9 joined by + - *, the groups joined by
+ - *; usual precedence inside a group.

Worked answer: each group on its own line, rewritten one operation at a
time (multiplications left to right, then + and - left to right), then the
outer operation on the two results:

    -1 + 2 + 9 * 5 = -1 + 2 + 45 = 1 + 45 = 46
    -2 + -4 + -4 * -7 = -2 + -4 + 28 = -6 + 28 = 22
    46 - 22 = 24
    So the answer is 24.
"""

from __future__ import annotations

import random

from caidllm.tasks.base import final_line

OPS = ("+", "-", "*")
NUMBERS = range(-9, 10)
GROUP = 4  # numbers per group


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _text(nums: list[int], ops: list[str]) -> str:
    parts = [str(nums[0])]
    for op, n in zip(ops, nums[1:]):
        parts += [op, str(n)]
    return " ".join(parts)


def reduce_group(nums: list[int], ops: list[str]) -> tuple[str, int]:
    """'a op b op c op d = ... = value', one operation per '='."""
    nums, ops = list(nums), list(ops)
    steps = [_text(nums, ops)]
    while ops:
        i = ops.index("*") if "*" in ops else 0
        nums[i : i + 2] = [_apply(nums[i], ops[i], nums[i + 1])]
        del ops[i]
        steps.append(_text(nums, ops))
    return " = ".join(steps), nums[0]


def make(groups: list[tuple[list[int], list[str]]], outer: str) -> tuple[str, str, str]:
    texts = [_text(n, o) for n, o in groups]
    prompt = f"(({texts[0]}) {outer} ({texts[1]})) ="
    lines, values = [], []
    for nums, ops in groups:
        line, value = reduce_group(nums, ops)
        lines.append(line)
        values.append(value)
    result = _apply(values[0], outer, values[1])
    lines.append(f"{values[0]} {outer} {values[1]} = {result}")
    target = str(result)
    return prompt, "\n".join(lines + [final_line(target)]), target


def generate(rng: random.Random) -> tuple[str, str, str]:
    groups = [
        ([rng.choice(NUMBERS) for _ in range(GROUP)], [rng.choice(OPS) for _ in range(GROUP - 1)])
        for _ in range(2)
    ]
    return make(groups, rng.choice(OPS))
