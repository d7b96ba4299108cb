"""GSM8K-like word problems: one to three steps with small numbers.

Each template draws its numbers so every intermediate value is a positive
integer below 100 (differences stay positive, divisions come out even), and
every product and quotient is one of the times table (factors 1 to 9).

Worked answer: one line per step, each using numbers from the question or
the result ending the line above, then the final line. A step on one-digit
numbers, and every product or quotient, is a single fact; a sum or
difference with a two-digit number is worked one column at a time, units
then tens (with the carry or the borrowed ten), then its result. So the
model only ever needs about 500 one-digit facts (drilled in
`arithmetic_facts`), never a two-digit one:

    4 * 9 = 36
    36 - 8: 16 - 8 = 8, 3 - 0 - 1 = 2, 28
    So the answer is 28.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable

from caidllm.tasks.base import final_line

NAMES = (
    "Tom Anna Ben Lily Sam Mia Jack Emma Leo Zoe Max Ella Noah Ava Liam Grace "
    "Omar Sofia Ravi Nina Carlos Hana Ivan Maya Luke Rosa Adam Chloe David Sara"
).split()
OBJECTS = (
    "apples oranges pencils marbles stickers cookies books cards shells stamps "
    "candies balloons flowers eggs crayons beads"
).split()
ITEMS = "pen notebook sandwich toy ball hat cup book kite puzzle".split()
WORDS = NAMES + OBJECTS + ITEMS


OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}


def borrowed(a_units: int, b_units: int) -> int:
    """The top of a units column of a difference: ten is borrowed from the tens when it must be."""
    return a_units if a_units >= b_units else a_units + 10


# Each template: rng, names (n, m), object o, items (i, j) ->
# (question, steps); a step (a, op, b) may use "prev" for the last result.
def _add(r, n, m, o, i, j):
    a, b = r.randint(2, 30), r.randint(2, 20)
    return f"{n} has {a} {o}. {m} gives {n} {b} more {o}. How many {o} does {n} have now?", [(a, "+", b)]


def _sub(r, n, m, o, i, j):
    a = r.randint(5, 40)
    b = r.randint(1, a - 1)
    return f"{n} had {a} {o} and gave {b} of them to {m}. How many {o} does {n} have left?", [(a, "-", b)]


def _mul(r, n, m, o, i, j):
    a, b = r.randint(2, 9), r.randint(2, 9)
    return f"{n} buys {a} boxes of {o}. Each box holds {b} {o}. How many {o} does {n} buy?", [(a, "*", b)]


def _div(r, n, m, o, i, j):
    b, q = r.randint(2, 9), r.randint(2, 9)
    return (
        f"{n} shares {b * q} {o} equally among {b} friends. How many {o} does each friend get?",
        [(b * q, "/", b)],
    )


def _times(r, n, m, o, i, j):
    a, b = r.randint(2, 9), r.randint(2, 5)
    return f"{m} has {a} {o}. {n} has {b} times as many {o} as {m}. How many {o} does {n} have?", [
        (a, "*", b)
    ]


def _half(r, n, m, o, i, j):
    a = 2 * r.randint(2, 9)
    return f"{n} had {a} {o}. {n} gave half of them to {m}. How many {o} does {n} have left?", [(a, "/", 2)]


def _add_sub(r, n, m, o, i, j):
    a, b = r.randint(2, 30), r.randint(2, 20)
    c = r.randint(1, a + b - 1)
    return (
        f"{n} has {a} {o}. {n} finds {b} more and then gives {c} to {m}. How many {o} does {n} have now?",
        [(a, "+", b), ("prev", "-", c)],
    )


def _mul_sub(r, n, m, o, i, j):
    a, b = r.randint(2, 9), r.randint(2, 9)
    c = r.randint(2, a * b - 1)
    return (
        f"{n} buys {a} bags with {b} {o} in each bag and gives {c} {o} to {m}. "
        f"How many {o} does {n} have left?",
        [(a, "*", b), ("prev", "-", c)],
    )


def _more_total(r, n, m, o, i, j):
    a, b = r.randint(2, 30), r.randint(2, 20)
    return (
        f"{n} has {a} {o}. {m} has {b} more {o} than {n}. How many {o} do they have together?",
        [(a, "+", b), (a, "+", "prev")],
    )


def _fewer_total(r, n, m, o, i, j):
    a = r.randint(5, 40)
    b = r.randint(2, a - 1)
    return (
        f"{n} has {a} {o}. {m} has {b} fewer {o} than {n}. How many {o} do they have together?",
        [(a, "-", b), (a, "+", "prev")],
    )


def _change(r, n, m, o, i, j):
    a, b = r.randint(1, 9), r.randint(2, 6)
    while a * b >= 50:  # the bill is at most 50 dollars, so every value stays below 100
        a, b = r.randint(1, 9), r.randint(2, 6)
    bill = next(x for x in (10, 20, 50) if x > a * b)
    return (
        f"A {i} costs {a} dollars. {n} buys {b} of them and pays with a {bill} dollar bill. "
        f"How much change does {n} get?",
        [(a, "*", b), (bill, "-", "prev")],
    )


def _pages(r, n, m, o, i, j):
    a, b = r.randint(2, 9), r.randint(2, 9)
    c = a * b + r.randint(1, min(30, 99 - a * b))
    return (
        f"{n} reads {a} pages every day for {b} days. The book has {c} pages. "
        f"How many pages are left to read?",
        [(a, "*", b), (c, "-", "prev")],
    )


def _three_days(r, n, m, o, i, j):
    a, b, c = r.randint(1, 20), r.randint(1, 20), r.randint(1, 20)
    return (
        f"{n} picked {a} {o} on Monday, {b} on Tuesday and {c} on Wednesday. "
        f"How many {o} did {n} pick in total?",
        [(a, "+", b), ("prev", "+", c)],
    )


def _spend(r, n, m, o, i, j):
    a = r.randint(10, 60)
    b = r.randint(1, a - 2)
    c = r.randint(1, a - b - 1)
    return (
        f"{n} has {a} dollars. {n} spends {b} dollars on a {i} and {c} dollars on a {j}. "
        f"How much money does {n} have left?",
        [(a, "-", b), ("prev", "-", c)],
    )


def _bags_then_add(r, n, m, o, i, j):
    b, q, c = r.randint(2, 8), r.randint(2, 9), r.randint(2, 9)
    return (
        f"{n} puts {b * q} {o} equally into {b} bags. Then {n} adds {c} more {o} to each bag. "
        f"How many {o} are in each bag now?",
        [(b * q, "/", b), ("prev", "+", c)],
    )


def _wage(r, n, m, o, i, j):
    a, b = r.randint(2, 9), r.randint(2, 5)
    c = r.randint(2, min(5, 9 - b))  # the hours stay one digit: a times-table product
    return (
        f"{n} earns {a} dollars per hour and works {b} hours on Monday and {c} hours on Tuesday. "
        f"How many dollars does {n} earn?",
        [(b, "+", c), ("prev", "*", a)],
    )


def _share_left(r, n, m, o, i, j):
    # Three steps: buy packs, eat some, share the rest evenly among k, each
    # friend getting at most 9 (a times-table quotient).
    while True:
        packs, per, k = r.randint(2, 6), r.randint(3, 9), r.randint(2, 5)
        total = packs * per
        choices = [e for e in range(1, 10) if (total - e) % k == 0 and k <= total - e <= 9 * k]
        if choices:
            break
    eaten = r.choice(choices)
    return (
        f"{n} buys {packs} packs of {per} {o}. {n} eats {eaten} of them and shares the rest equally "
        f"among {k} friends. How many {o} does each friend get?",
        [(packs, "*", per), ("prev", "-", eaten), ("prev", "/", k)],
    )


TEMPLATES: tuple[Callable, ...] = (
    _add,
    _sub,
    _mul,
    _div,
    _times,
    _half,
    _add_sub,
    _mul_sub,
    _more_total,
    _fewer_total,
    _change,
    _pages,
    _three_days,
    _spend,
    _bags_then_add,
    _wage,
    _share_left,
)


def columns(a: int, op: str, b: int) -> str:
    """One step's line. One-digit operands, products and quotients: the fact
    itself (``4 * 9 = 36``). A sum or difference with a two-digit operand:
    the units column, the tens column with its carry or borrowed ten, then
    the result (``36 - 8: 16 - 8 = 8, 3 - 0 - 1 = 2, 28``)."""
    if op in "*/":
        factor = a // b if op == "/" else a
        if not (1 <= factor <= 9 and 1 <= b <= 9) or (op == "/" and a % b):
            raise ValueError(f"{a} {op} {b} is not in the times table")
        return f"{a} {op} {b} = {OPERATIONS[op](a, b)}"
    value = OPERATIONS[op](a, b)
    if min(a, b) < 0 or not 0 <= value <= 99:
        raise ValueError(f"{a} {op} {b} leaves the range 0..99")
    if a < 10 and b < 10:
        return f"{a} {op} {b} = {value}"
    (a_tens, a_units), (b_tens, b_units) = divmod(a, 10), divmod(b, 10)
    if op == "+":
        units = f"{a_units} + {b_units} = {a_units + b_units}"
        tens = f"{a_tens} + {b_tens}" + (" + 1" if a_units + b_units > 9 else "")
    else:
        top = borrowed(a_units, b_units)
        units = f"{top} - {b_units} = {top - b_units}"
        tens = f"{a_tens} - {b_tens}" + (" - 1" if top > 9 else "")
    return f"{a} {op} {b}: {units}, {tens} = {value // 10}, {value}"


def solve(steps: list[tuple]) -> tuple[list[str], int]:
    lines, prev = [], None
    for a, op, b in steps:
        a = prev if a == "prev" else a
        b = prev if b == "prev" else b
        lines.append(columns(a, op, b))  # raises on a step outside the one-digit facts
        prev = OPERATIONS[op](a, b)
    return lines, prev


def generate(rng: random.Random) -> tuple[str, str, str]:
    template = rng.choice(TEMPLATES)
    n, m = rng.sample(NAMES, 2)
    i, j = rng.sample(ITEMS, 2)
    question, steps = template(rng, n, m, rng.choice(OBJECTS), i, j)
    lines, value = solve(steps)
    target = str(value)
    return question, "\n".join(lines + [final_line(target)]), target
