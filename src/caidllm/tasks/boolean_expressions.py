"""BBH boolean_expressions: e.g. ``not ( True ) and ( True ) is`` -> ``False``.

Every BBH input is an expression of exactly 8 tokens over True/False,
not/and/or and parentheses, followed by " is"; the 250 BBH inputs match a
uniform draw from all 2122 such expressions, so that is what we sample.

Worked answer: the expression, then one rewrite per line, each applying a
single reduction (innermost parenthesis first; inside it ``not``, then
``and``, then ``or``, leftmost first), so every line is a small local edit
of the line above:

    not ( True ) and ( True )
    = not True and ( True )
    = not True and True
    = False and True
    = False
    So the answer is False.
"""

from __future__ import annotations

import random
from functools import cache

from caidllm.tasks.base import final_line

LENGTH = 8  # tokens before " is" in every BBH input
VALUES = ("True", "False")
WORDS = ("True", "False", "not", "and", "or", "is")


def _unary(n: int) -> list[tuple[str, ...]]:
    """Token patterns of n tokens for: V | not unary | ( expr )."""
    if n < 1:
        return []
    out = [("V",)] if n == 1 else []
    out += [("not",) + u for u in _unary(n - 1)]
    out += [("(",) + e + (")",) for e in _expr(n - 2)]
    return out


@cache
def _expr(n: int) -> tuple[tuple[str, ...], ...]:
    """Token patterns of n tokens for: unary ((and|or) unary)*."""
    out = list(_unary(n))
    for a in range(1, n - 1):
        for u in _unary(a):
            for op in ("and", "or"):
                out += [u + (op,) + e for e in _expr(n - a - 1)]
    return tuple(out)


@cache
def all_expressions() -> tuple[str, ...]:
    """Every 8-token expression, sorted (the whole BBH input space)."""
    exprs = set()
    for pattern in _expr(LENGTH):
        slots = pattern.count("V")
        for bits in range(2**slots):
            vals = iter(VALUES[(bits >> k) & 1] for k in range(slots))
            exprs.add(" ".join(next(vals) if t == "V" else t for t in pattern))
    return tuple(sorted(exprs))


def reduce_span(toks: list[str]) -> tuple[int, int, str]:
    """The single next reduction (see module doc): toks[lo:hi] becomes the value."""
    # Innermost group: the first ")" and the "(" nearest before it.
    if ")" in toks:
        hi = toks.index(")")
        lo = hi - 1 - toks[hi - 1 :: -1].index("(")
        if hi - lo == 2:  # "( V )" -> "V"
            return lo, hi + 1, toks[lo + 1]
        start, end = lo + 1, hi
    else:
        start, end = 0, len(toks)
    seg = toks[start:end]
    for i in range(len(seg) - 1):
        if seg[i] == "not" and seg[i + 1] in VALUES:
            return start + i, start + i + 2, str(seg[i + 1] != "True")
    for op in ("and", "or"):
        if op in seg:
            i = seg.index(op)
            a, b = seg[i - 1] == "True", seg[i + 1] == "True"
            return start + i - 1, start + i + 2, str(a and b if op == "and" else a or b)
    raise ValueError(f"cannot reduce {' '.join(toks)!r}")


def _reduce_once(toks: list[str]) -> list[str]:
    """Apply the single next reduction (see module doc)."""
    lo, hi, value = reduce_span(toks)
    return toks[:lo] + [value] + toks[hi:]


def solve(expr: str) -> tuple[list[str], str]:
    """The rewrite lines (after the first) and the final value."""
    toks = expr.split()
    lines = []
    while len(toks) > 1:
        toks = _reduce_once(toks)
        lines.append(" ".join(toks))
    return lines, toks[0]


def make(expr: str) -> tuple[str, str, str]:
    lines, value = solve(expr)
    answer = "\n".join([expr] + ["= " + line for line in lines] + [final_line(value)])
    return f"{expr} is", answer, value


def generate(rng: random.Random) -> tuple[str, str, str]:
    exprs = all_expressions()
    return make(exprs[rng.randrange(len(exprs))])
