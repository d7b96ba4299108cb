"""Long "cot" worked answers for four BBH families (the tasks `<family>_cot`).

Each draws its input exactly as the family does (the same generator, so the same
prompt distribution and target) and shares the family's split of the input space
(registry: `split_key`), then works the answer out from the prompt's text in
longer, more explicit steps than `tiny`'s chains, for the `tiny-cot` model:

* web_of_lies_cot: per person, the claim, the status it is about, whether the claim
  holds, and the person's status.
* boolean_expressions_cot: per rewrite, the reduced part and its value, then the
  whole expression after it.
* multistep_arithmetic_cot: each group one operation a line with the value it gives
  and the rest of the group, then the outer operation.
* navigate_cot: the facing and the (x, y) position after every instruction, every
  coordinate change written as a sum, then whether the end is the start.

The families' own tasks (and `tiny`'s training) are untouched.
"""

from __future__ import annotations

import random
import re

from caidllm.tasks import boolean_expressions, multistep_arithmetic_two, navigate, web_of_lies
from caidllm.tasks.base import final_line

WORDS = (
    "claim",
    "true",
    "false",
    "Left",
    "Right",
    "left",
    "right",
    "group",
    "Start",
    "facing",
    "at",
    "End",
    "start",
    "not",
    "the",
    "Reduce",
    "gives",
)


def _status(truthful: bool) -> str:
    return "tells the truth" if truthful else "lies"


def web_of_lies_cot(rng: random.Random) -> tuple[str, str, str]:
    prompt, _, target = web_of_lies.generate(rng)
    first = re.match(r"Question: (\w+) (tells the truth|lies)\.", prompt)
    claims = re.findall(r"(\w+) says (\w+) (tells the truth|lies)\.", prompt)
    truthful = first.group(2) == "tells the truth"
    lines = [f"- {first.group(1)} {_status(truthful)}."]
    for speaker, subject, said in claims:
        holds = (said == "tells the truth") == truthful
        lines.append(
            f"- {speaker} says {subject} {said}. {subject} {_status(truthful)}. "
            f"The claim is {'true' if holds else 'false'}, so {speaker} {_status(holds)}."
        )
        truthful = holds
    return prompt, "\n".join(lines + [final_line("Yes" if truthful else "No")]), target


def boolean_expressions_cot(rng: random.Random) -> tuple[str, str, str]:
    prompt, _, target = boolean_expressions.generate(rng)
    toks = prompt.removesuffix(" is").split()
    lines = [" ".join(toks)]
    while len(toks) > 1:
        lo, hi, value = boolean_expressions.reduce_span(toks)
        part = " ".join(toks[lo:hi])
        toks = toks[:lo] + [value] + toks[hi:]
        lines.append(f"Reduce {part} gives {value}: {' '.join(toks)}")
    return prompt, "\n".join(lines + [final_line(toks[0])]), target


def _group(name: str, text: str) -> tuple[list[str], int]:
    nums = [int(t) for t in text.split()[::2]]
    ops = text.split()[1::2]
    lines = [f"{name}: {text}"]
    while ops:
        i = ops.index("*") if "*" in ops else 0
        a, op, b = nums[i], ops[i], nums[i + 1]
        value = multistep_arithmetic_two._apply(a, op, b)
        nums[i : i + 2] = [value]
        del ops[i]
        rest = multistep_arithmetic_two._text(nums, ops)
        lines.append(f"{a} {op} {b} = {value}, so {rest}" if ops else f"{a} {op} {b} = {value}")
    lines.append(f"The {name.lower()} group is {nums[0]}.")
    return lines, nums[0]


def multistep_arithmetic_cot(rng: random.Random) -> tuple[str, str, str]:
    prompt, _, target = multistep_arithmetic_two.generate(rng)
    left, outer, right = re.fullmatch(r"\(\((.*)\) ([-+*]) \((.*)\)\) =", prompt).groups()
    left_lines, a = _group("Left", left)
    right_lines, b = _group("Right", right)
    value = multistep_arithmetic_two._apply(a, outer, b)
    lines = left_lines + right_lines + [f"{a} {outer} {b} = {value}"]
    return prompt, "\n".join(lines + [final_line(str(value))]), target


def _move(x: int, y: int, heading: int, n: int) -> tuple[str, int, int]:
    """'x -3 + 5 = 2' (or y): the coordinate that changes, as a sum."""
    dx, dy = navigate._HEADINGS[heading]
    axis, old, delta = ("x", x, dx * n) if dx else ("y", y, dy * n)
    new = old + delta
    sign = "+" if delta > 0 else "-"
    text = f"{axis} {old} {sign} {abs(delta)} = {new}"
    return text, (new if dx else x), (new if dy else y)


def navigate_cot(rng: random.Random) -> tuple[str, str, str]:
    prompt, _, target = navigate.generate(rng)
    body = prompt.removeprefix(navigate.HEADER).removesuffix(navigate.OPTIONS)
    forward_mode = navigate.ALWAYS in body
    sentences = re.findall(r"(Turn \w+|Take \d+ steps?(?: \w+)?)\.", body)
    x = y = facing = 0
    lines = ["Start: facing north at 0, 0." if not forward_mode else "Start: at 0, 0."]
    for sentence in sentences:
        words = sentence.split()
        if words[0] == "Turn":
            facing = (facing + navigate.TURNS[words[1]]) % 4
            lines.append(f"{sentence}: facing {navigate.COMPASS[facing]} at {x}, {y}.")
            continue
        heading = navigate.RELATIVE.index(words[3]) if forward_mode else facing
        sum_text, x, y = _move(x, y, heading, int(words[1]))
        where = "" if forward_mode else f"facing {navigate.COMPASS[facing]}, "
        lines.append(f"{sentence}: {where}{sum_text}, at {x}, {y}.")
    back = x == 0 and y == 0
    lines.append(f"End at {x}, {y}: {'the start' if back else 'not the start'}.")
    return prompt, "\n".join(lines + [final_line("Yes" if back else "No")]), target


# task name -> (generator, the family whose split and scoring it shares)
GENERATORS = {
    "web_of_lies_cot": (web_of_lies_cot, "web_of_lies"),
    "boolean_expressions_cot": (boolean_expressions_cot, "boolean_expressions"),
    "multistep_arithmetic_cot": (multistep_arithmetic_cot, "multistep_arithmetic_two"),
    "navigate_cot": (navigate_cot, "navigate"),
}
