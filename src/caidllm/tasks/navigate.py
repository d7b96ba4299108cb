"""BBH navigate: do the instructions lead back to the starting point?

Two kinds of input, as in BBH:
  * ``Always face forward.`` then steps with a direction
    (``Take 3 steps left.``; forward/backward/left/right);
  * turns (``Turn left.``, ``Turn right.``, ``Turn around.``) mixed with
    steps in the facing direction (``Take 7 steps.``).
Step counts are 1..10; the answer is Yes for half of the examples.

Worked answer (only additions of positive numbers, never signed sums):
  * turning inputs first get one trace line: the start facing, then one
    item per instruction, "<turn> <new facing>" or "<steps> <facing>";
    each item depends only on its instruction and the item before;
  * then one line per axis: the running sum of the steps in each of its two
    directions (in order of appearance), and whether the totals are equal.

    north, left west, 7 west, around east, 3 east.
    north 0, south 0: equal.
    east 3, west 7: differ.
    So the answer is No.
"""

from __future__ import annotations

import random

from caidllm.tasks.base import final_line

HEADER = "If you follow these instructions, do you return to the starting point?"
OPTIONS = "\nOptions:\n- Yes\n- No"
ALWAYS = "Always face forward."
MAX_STEPS = 10
# Number of instructions (excluding "Always face forward.") and its weight.
LENGTHS = {1: 1, 2: 3, 3: 8, 4: 10, 5: 10, 6: 10, 7: 10, 8: 10, 9: 8, 10: 6, 11: 3, 12: 2}
COMPASS = ("north", "east", "south", "west")  # clockwise, start facing north
_HEADINGS = ((0, 1), (1, 0), (0, -1), (-1, 0))  # unit (dx, dy) per COMPASS index
TURN_P = 0.35  # share of turns among the instructions of turning inputs
TURNS = {"left": -1, "right": 1, "around": 2}
# "Always face forward" directions, in COMPASS order (forward moves north).
RELATIVE = ("forward", "right", "backward", "left")
WORDS = (
    "If you follow these instructions do return to starting point Always face "
    "forward backward left right Take step steps Turn around Options Yes No "
    "north south east west equal differ"
).split()


def _take(n: int, direction: str = "") -> str:
    word = "step" if n == 1 else "steps"
    return f"Take {n} {word}{' ' + direction if direction else ''}."


def _chain(nums: list[int]) -> str:
    """'6 + 4 = 10 + 3 = 13': a running sum, one addition at a time."""
    if not nums:
        return "0"
    text, total = str(nums[0]), nums[0]
    for n in nums[1:]:
        total += n
        text += f" + {n} = {total}"
    return text


def solve(instructions: list[tuple[str, int]], forward_mode: bool) -> tuple[list[str], bool]:
    """instructions: ("turn", TURNS key index) or (direction, steps); in
    forward mode direction is one of RELATIVE, else "" (facing)."""
    lines = []
    moves: dict[str, list[int]] = {}
    if forward_mode:
        for direction, n in instructions:
            moves.setdefault(direction, []).append(n)
        names = RELATIVE
    else:
        facing = 0
        items = [COMPASS[facing]]
        for kind, value in instructions:
            if kind == "turn":
                turn = list(TURNS)[value]
                facing = (facing + TURNS[turn]) % 4
                items.append(f"{turn} {COMPASS[facing]}")
            else:
                moves.setdefault(COMPASS[facing], []).append(value)
                items.append(f"{value} {COMPASS[facing]}")
        lines.append(", ".join(items) + ".")
        names = COMPASS
    # Pair opposite directions: (names[0], names[2]) and (names[1], names[3]).
    back = True
    for a, b in ((names[0], names[2]), (names[1], names[3])):
        a_steps, b_steps = moves.get(a, []), moves.get(b, [])
        equal = sum(a_steps) == sum(b_steps)
        lines.append(f"{a} {_chain(a_steps)}, {b} {_chain(b_steps)}: {'equal' if equal else 'differ'}.")
        back = back and equal
    return lines, back


def make(instructions: list[tuple[str, int]], forward_mode: bool) -> tuple[str, str, str]:
    sentences = [ALWAYS] if forward_mode else []
    for kind, value in instructions:
        if kind == "turn":
            sentences.append(f"Turn {list(TURNS)[value]}.")
        else:
            sentences.append(_take(value, kind))
    prompt = f"{HEADER} {' '.join(sentences)}{OPTIONS}"
    lines, back = solve(instructions, forward_mode)
    target = "Yes" if back else "No"
    return prompt, "\n".join(lines + [final_line(target)]), target


def _draw(rng: random.Random, k: int, forward_mode: bool) -> list[tuple[str, int]]:
    out = []
    for _ in range(k):
        if forward_mode:
            out.append((rng.choice(RELATIVE), rng.randint(1, MAX_STEPS)))
        elif rng.random() < TURN_P:
            out.append(("turn", rng.randrange(len(TURNS))))
        else:
            out.append(("", rng.randint(1, MAX_STEPS)))
    return out


def _step(state: tuple[int, int, int], instr: tuple[str, int], forward_mode: bool) -> tuple[int, int, int]:
    x, y, facing = state
    kind, value = instr
    if kind == "turn":
        return x, y, (facing + TURNS[list(TURNS)[value]]) % 4
    heading = RELATIVE.index(kind) if forward_mode else facing
    dx, dy = _HEADINGS[heading]
    return x + dx * value, y + dy * value, facing


def returns(instructions: list[tuple[str, int]], forward_mode: bool) -> bool:
    """Direct position check (no worked answer): an independent oracle."""
    state = (0, 0, 0)
    for instr in instructions:
        state = _step(state, instr, forward_mode)
    return state[:2] == (0, 0)


def _closing(state: tuple[int, int, int], forward_mode: bool) -> list[tuple[tuple[str, int], float]]:
    """The single instructions that bring `state` back to the start, each
    with its chance of being drawn by _draw."""
    x, y, facing = state
    if x == 0 and y == 0:  # only a turn keeps us there
        return [] if forward_mode else [(("turn", t), TURN_P / len(TURNS)) for t in range(len(TURNS))]
    if x and y:
        return []
    n = abs(x or y)
    heading = _HEADINGS.index((-(x > 0) + (x < 0), -(y > 0) + (y < 0)))
    if n > MAX_STEPS:
        return []
    if forward_mode:
        return [((RELATIVE[heading], n), 1 / (4 * MAX_STEPS))]
    return [(("", n), (1 - TURN_P) / MAX_STEPS)] if heading == facing else []


def _draw_yes(rng: random.Random, k: int, forward_mode: bool) -> list[tuple[str, int]] | None:
    """A returning sequence with the same law as redrawing whole sequences
    until one returns, but far cheaper: draw k-1 instructions, then accept
    with the chance that a random last instruction closes the loop."""
    p_max = 1 / (4 * MAX_STEPS) if forward_mode else TURN_P  # largest chance to close
    for _ in range(3000):
        state = (0, 0, 0)
        prefix = _draw(rng, k - 1, forward_mode)
        for instr in prefix:
            state = _step(state, instr, forward_mode)
        closing = _closing(state, forward_mode)
        p_close = sum(p for _, p in closing)
        if closing and rng.random() < p_close / p_max:
            last = rng.choices([o for o, _ in closing], weights=[p for _, p in closing])[0]
            return prefix + [last]
    return None


def generate(rng: random.Random) -> tuple[str, str, str]:
    want_yes = rng.random() < 0.5
    forward_mode = rng.random() < 0.5
    while True:
        # Fix the length first, then draw until the answer is the wanted
        # one, so Yes and No share one length profile.
        k = rng.choices(list(LENGTHS), weights=list(LENGTHS.values()))[0]
        if want_yes:
            instructions = _draw_yes(rng, k, forward_mode)
            if instructions is not None:
                return make(instructions, forward_mode)
            continue
        for _ in range(100):
            instructions = _draw(rng, k, forward_mode)
            if not returns(instructions, forward_mode):
                return make(instructions, forward_mode)
