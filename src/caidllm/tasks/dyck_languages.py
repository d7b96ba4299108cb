"""BBH dyck_languages: close the open brackets of a sequence.

Input: ``Complete the rest of the sequence, making sure that the parentheses
are closed properly. Input: [ { [ ] }`` over ( [ { <, space separated, from
a few to ~56 symbols; target: the closing brackets only (``} ]`` ...).

Worked answer, no stack dumps (they grow with depth):
  1. every symbol followed by the depth after it, so each depth is the depth
     before it plus or minus one;
  2. the still-open brackets, found from the deepest level down: for level
     d, the last open bracket marked d;
  3. the answer closes them in that same order.

    [1 {2 [3 ]2 }1 (2 <3
    <3 (2 [1
    So the answer is > ) ].
"""

from __future__ import annotations

import random

from caidllm.tasks.base import final_line

HEADER = "Complete the rest of the sequence, making sure that the parentheses are closed properly. Input:"
PAIRS = {"(": ")", "[": "]", "{": "}", "<": ">"}
WORDS = (
    "Complete",
    "the",
    "rest",
    "of",
    "sequence",
    "making",
    "sure",
    "that",
    "parentheses",
    "are",
    "closed",
    "properly",
    "Input",
)
# Open brackets left at the end (answer length) and weights.
OPEN_AT_END = {1: 24, 2: 24, 3: 20, 4: 13, 5: 8, 6: 5, 7: 3, 8: 2, 9: 1}
MAX_LEN = 56
MAX_DEPTH = 12


def solve(symbols: list[str]) -> tuple[list[str], list[str]]:
    """Depth-marked symbols and the unclosed brackets, deepest first."""
    marked, stack = [], []
    for s in symbols:
        if s in PAIRS:
            stack.append(s)
        else:
            if not stack or PAIRS[stack[-1]] != s:
                raise ValueError(f"unbalanced sequence {' '.join(symbols)!r}")
            stack.pop()
        marked.append(f"{s}{len(stack)}")
    unclosed = [f"{s}{d + 1}" for d, s in enumerate(stack)][::-1]
    return marked, unclosed


def make(symbols: list[str]) -> tuple[str, str, str]:
    marked, unclosed = solve(symbols)
    target = " ".join(PAIRS[u[0]] for u in unclosed)
    answer = "\n".join([" ".join(marked), " ".join(unclosed), final_line(target)])
    return f"{HEADER} {' '.join(symbols)}", answer, target


def _length(rng: random.Random, open_at_end: int) -> int:
    """Mostly 4..40 symbols, sometimes longer or very short."""
    r = rng.random()
    if r < 0.08:
        n = rng.randint(1, 4)
    elif r < 0.88:
        n = rng.randint(4, 40)
    else:
        n = rng.randint(41, MAX_LEN)
    n = max(n, open_at_end)
    return n + (n - open_at_end) % 2  # closed part has even length


def generate(rng: random.Random) -> tuple[str, str, str]:
    end = rng.choices(list(OPEN_AT_END), weights=list(OPEN_AT_END.values()))[0]
    n = _length(rng, end)
    symbols, stack = [], []
    for left in range(n, 0, -1):
        depth = len(stack)
        # Only moves from which depth `end` is still reachable in `left` steps.
        can_open = depth < MAX_DEPTH and depth + 1 - end <= left - 1
        can_close = depth > 0 and end - (depth - 1) <= left - 1
        if can_open and (not can_close or rng.random() < 0.5):
            stack.append(rng.choice(list(PAIRS)))
            symbols.append(stack[-1])
        else:
            symbols.append(PAIRS[stack.pop()])
    return make(symbols)
