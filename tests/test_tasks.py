"""Task generators and scorers: determinism, disjoint splits, formats, and
answers checked against independent solvers written here from the inputs."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from caidllm.errors import InputError
from caidllm.tasks import (
    DRILL_NAMES,
    SPLITS,
    TASK_NAMES,
    arithmetic,
    arithmetic_facts,
    corpus_texts,
    extract_answer,
    get_task,
    get_training_task,
    score,
    split_of,
)
from caidllm.tasks.base import MAX_ANSWER_TOKENS, count_tokens
from caidllm.tasks.boolean_expressions import all_expressions
from caidllm.tasks.web_of_lies import NAMES

BBH_DIR = Path(os.environ.get("CAIDLLM_BBH_DIR", Path(__file__).resolve().parents[2] / "shared/data/bbh"))

# --- input formats -------------------------------------------------------------------------

_STATUS = r"(tells the truth|lies)"
_NAV_STEP = r"Take (1 step|(?:[2-9]|10) steps)"
FORMATS = {
    "boolean_expressions": r"(?:(?:not|True|False|and|or|\(|\)) ){8}is",
    "web_of_lies": (
        rf"Question: (\w+) {_STATUS}\.(?: (\w+) says (\w+) {_STATUS}\.){{4}} Does (\w+) tell the "
        r"truth\?"
    ),
    "navigate": (
        r"If you follow these instructions, do you return to the starting point\? "
        rf"(?:Always face forward\.(?: {_NAV_STEP} (?:forward|backward|left|right)\.)+"
        rf"|(?:Turn (?:left|right|around)\.|{_NAV_STEP}\.)(?: (?:Turn "
        rf"(?:left|right|around)\.|{_NAV_STEP}\.))*)"
        r"\nOptions:\n- Yes\n- No"
    ),
    "dyck_languages": (
        r"Complete the rest of the sequence, making sure that the parentheses are closed properly\. "
        r"Input: [(\[{<)\]}>](?: [(\[{<)\]}>])*"
    ),
    "multistep_arithmetic_two": r"\(\((-?\d(?: [-+*] -?\d){3})\) [-+*] \((-?\d(?: [-+*] -?\d){3})\)\) =",
    "arithmetic": r"[A-Z][^\n]*\?",
}


@cache
def split_examples(task: str, split: str, n: int = 1500):
    return tuple(get_task(task).examples(split, n, seed=0))


def all_examples(task: str):
    return [ex for split in SPLITS for ex in split_examples(task, split)]


# --- API and bad input ---------------------------------------------------------------------


def test_task_names():
    assert TASK_NAMES == (
        "boolean_expressions",
        "web_of_lies",
        "navigate",
        "dyck_languages",
        "multistep_arithmetic_two",
        "arithmetic",
    )


def test_bad_input_names_value_and_choices():
    with pytest.raises(InputError, match=r"'nope'.*navigate"):
        get_task("nope")
    with pytest.raises(InputError, match=r"'dev'.*train, validation, test"):
        get_task("navigate").examples("dev", 3)
    for n in (0, -2, 1.5, "3"):
        with pytest.raises(InputError, match="n must be"):
            get_task("navigate").examples("train", n)
    with pytest.raises(InputError, match="'nope'"):
        score("nope", "So the answer is 1.", "1")


# --- determinism and splits ----------------------------------------------------------------


@pytest.mark.parametrize("task", TASK_NAMES)
def test_deterministic(task):
    t = get_task(task)
    assert t.examples("train", 40, seed=7) == t.examples("train", 40, seed=7)
    assert t.examples("train", 40, seed=7) != t.examples("train", 40, seed=8)
    assert t.example(3) == t.example(3)
    assert [t.example(s).prompt for s in range(20)] != [t.example(s + 20).prompt for s in range(20)]
    # A longer request extends a shorter one.
    assert t.examples("test", 30, seed=1)[:10] == t.examples("test", 10, seed=1)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_splits_disjoint(task):
    prompts = {}
    for split in SPLITS:
        exs = split_examples(task, split)
        assert len(exs) == 1500 and all(ex.task == task for ex in exs)
        assert all(split_of(task, ex.prompt) == split for ex in exs)
        prompts[split] = {ex.prompt for ex in exs}
    assert not prompts["train"] & prompts["validation"]
    assert not prompts["train"] & prompts["test"]
    assert not prompts["validation"] & prompts["test"]
    # Other seeds stay inside their split too.
    other = {ex.prompt for ex in get_task(task).examples("train", 300, seed=99)}
    assert not other & (prompts["validation"] | prompts["test"])


def test_exclude_redraws():
    t = get_task("boolean_expressions")
    first = t.examples("test", 20)
    banned = {ex.prompt for ex in first}
    assert not banned & {ex.prompt for ex in t.examples("test", 20, exclude=banned)}


# --- answers and scoring -------------------------------------------------------------------


@pytest.mark.parametrize("task", TASK_NAMES)
def test_answers_end_with_final_line_and_score(task):
    for ex in all_examples(task):
        assert ex.answer.endswith(f"\nSo the answer is {ex.target}.")
        assert ex.answer.count("the answer is") == 1
        assert extract_answer(ex.answer) == ex.target
        assert score(task, ex.answer, ex.target)
        assert re.fullmatch(FORMATS[task], ex.prompt), ex.prompt
        assert count_tokens(ex.answer) <= MAX_ANSWER_TOKENS


def test_extract_answer():
    assert extract_answer("blah\nSo the answer is False.") == "False"
    assert extract_answer("the answer is 3.\nSo the answer is -24.") == "-24"
    assert extract_answer("So the answer is ] ] ).") == "] ] )"
    assert extract_answer("So The Answer Is  Yes .  ") == "Yes"
    assert extract_answer("No") == "No"  # a bare direct answer
    assert extract_answer("24.") == "24"
    assert extract_answer("46 - 22 = 24\n24") is None  # worked answer without its line
    assert extract_answer("") is None
    assert extract_answer("So the answer is .") is None


def test_scorers_reject_near_misses():
    assert not score("boolean_expressions", "x\nSo the answer is True.", "False")
    assert not score("boolean_expressions", "x\nSo the answer is false.", "False")
    assert score("dyck_languages", "x\nSo the answer is ]  ].", "] ]")
    assert not score("dyck_languages", "x\nSo the answer is ] ] ).", "] ]")
    assert not score("dyck_languages", "x\nSo the answer is ].", "] ]")
    assert not score("multistep_arithmetic_two", "x\nSo the answer is 25.", "24")
    assert not score("multistep_arithmetic_two", "x\nSo the answer is -24.", "24")
    assert not score("arithmetic", "x\nSo the answer is 240.", "24")
    assert not score("web_of_lies", "x\nSo the answer is no.", "No")
    assert not score("navigate", "x\nSo the answer is Yes or No.", "No")
    assert not score("multistep_arithmetic_two", "46 - 22 = 24\n", "24")  # no answer line
    assert not score("navigate", "", "No")
    assert score("navigate", "x\nSo the answer is No.", "No")


# --- independent solvers -------------------------------------------------------------------


def test_boolean_space_and_values():
    exprs = all_expressions()
    assert len(exprs) == 2122 == len(set(exprs))
    for expr in exprs:
        assert len(expr.split()) == 8
    for ex in all_examples("boolean_expressions"):
        assert ex.target == str(eval(ex.prompt[: -len(" is")]))  # noqa: S307 (only True/False/not/and/or)
        lines = ex.answer.split("\n")
        assert lines[0] == ex.prompt[: -len(" is")]
        for line in lines[1:-1]:  # every rewrite keeps the value
            assert line.startswith("= ") and str(eval(line[2:])) == ex.target  # noqa: S307


def _web_of_lies_truth(prompt: str) -> bool:
    m = re.fullmatch(FORMATS["web_of_lies"], prompt)
    truthful = m.group(2) == "tells the truth"
    said = re.findall(rf"(\w+) says (\w+) {_STATUS}\.", prompt)
    names = [m.group(1)]
    for speaker, about, status in said:
        assert about == names[-1]
        names.append(speaker)
        truthful = truthful == (status == "tells the truth")
    assert m.group(m.lastindex) == names[-1]
    assert len(set(names)) == 5 and set(names) <= set(NAMES)
    return truthful


def test_web_of_lies_truth_chain():
    exs = all_examples("web_of_lies")
    for ex in exs:
        assert ex.target == ("Yes" if _web_of_lies_truth(ex.prompt) else "No")
    assert 0.45 < Counter(ex.target for ex in exs)["Yes"] / len(exs) < 0.55


def _navigate_returns(prompt: str) -> bool:
    body = prompt.split("? ", 1)[1].split("\n")[0]
    x = y = 0
    dx, dy = 0, 1
    for sentence in body.split(". "):
        words = sentence.rstrip(".").split()
        if words[0] == "Turn":
            dx, dy = {"left": (-dy, dx), "right": (dy, -dx), "around": (-dx, -dy)}[words[1]]
        elif words[0] == "Take":
            n = int(words[1])
            dir_x, dir_y = {"forward": (0, 1), "backward": (0, -1), "left": (-1, 0), "right": (1, 0)}.get(
                words[-1], (dx, dy)
            )
            x, y = x + n * dir_x, y + n * dir_y
    return x == 0 and y == 0


def test_navigate_positions_and_balance():
    exs = all_examples("navigate")
    for ex in exs:
        assert ex.target == ("Yes" if _navigate_returns(ex.prompt) else "No"), ex.prompt
    targets = Counter(ex.target for ex in exs)
    assert 0.45 < targets["Yes"] / len(exs) < 0.55
    modes = Counter("Always face forward" in ex.prompt for ex in exs)
    assert 0.4 < modes[True] / len(exs) < 0.6
    counts = Counter(ex.prompt.count(".") - ("Always" in ex.prompt) for ex in exs)
    assert min(counts) >= 1 and max(counts) <= 12


def test_dyck_completion_is_minimal_closing():
    pairs = {"(": ")", "[": "]", "{": "}", "<": ">"}
    lengths = []
    for ex in all_examples("dyck_languages"):
        symbols = ex.prompt.split("Input: ")[1].split()
        lengths.append(len(symbols))
        stack = []
        for s in symbols:
            if s in pairs:
                stack.append(s)
            else:
                assert pairs[stack.pop()] == s
        assert stack, ex.prompt
        assert ex.target == " ".join(pairs[s] for s in reversed(stack))
    assert min(lengths) <= 3 and max(lengths) >= 45


def test_multistep_values():
    for ex in all_examples("multistep_arithmetic_two"):
        assert ex.target == str(eval(ex.prompt[: -len(" =")]))  # noqa: S307 (digits and + - * only)
        for line in ex.answer.split("\n")[:-1]:  # every rewrite keeps the value
            values = {eval(part) for part in line.split(" = ")}  # noqa: S307
            assert len(values) == 1, line


def _facts_of(line: str) -> list[str]:
    """The equations of a chain line: "36 - 8: 16 - 8 = 8, 3 - 0 - 1 = 2, 28"
    -> ["16 - 8 = 8", "3 - 0 - 1 = 2"]; "4 * 9 = 36" -> itself."""
    body = line.split(": ", 1)[-1]
    return [part for part in body.split(", ") if " = " in part]


def test_arithmetic_lines():
    """Every step is one fact, or a two-digit sum or difference worked by
    columns; every fact a chain uses is one the drill teaches."""
    steps = Counter()
    drilled = arithmetic_facts.fact_space()
    column_steps = 0
    for ex in all_examples("arithmetic"):
        lines = ex.answer.split("\n")[:-1]
        steps[len(lines)] += 1
        for line in lines:
            for fact in _facts_of(line):
                lhs, value = fact.split(" = ")
                assert lhs in drilled, line
                assert eval(lhs) == int(value) >= 0  # noqa: S307 (digits and + - * / only)
            if ": " in line:  # columns: units, tens, then the result
                column_steps += 1
                head, rest = line.split(": ")
                a, op, b = head.split()
                (units, u), (tens, t) = [f.split(" = ") for f in _facts_of(line)]
                result = int(rest.split(", ")[-1])
                assert result == eval(head) == 10 * int(t) + int(u) % 10  # noqa: S307
                assert max(int(a), int(b)) >= 10 and 0 < result < 100
                assert units.split()[0].endswith(a[-1]) and units.split()[2] == b[-1]  # the units digits
                assert tens.split()[0] == str(int(a) // 10) and tens.split()[2] == str(int(b) // 10)
            else:
                (fact,) = _facts_of(line)
                a, op, b = fact.split(" = ")[0].split()
                assert int(a) < 10 and int(b) < 10 or op == "/"
        for before, after in zip(lines, lines[1:]):  # "prev": a step uses the result ending the line above
            assert before.split()[-1] in after.split(":")[0].split(" = ")[0].split(), (before, after)
        last = lines[-1].split()[-1]
        assert last == ex.target and 0 < int(last) < 100
    assert set(steps) == {1, 2, 3}
    assert column_steps > 100


def test_navigate_trace_and_axis_lines():
    """Turning inputs: a trace with the start facing, then one item per
    instruction (a turn and the new facing, or the steps and the facing
    they go). Every input: one line per axis with each direction's running
    sum of its step counts in order of appearance, one drilled fact per
    addition, and whether the totals are equal; Yes exactly when both are."""
    drilled = arithmetic_facts.fact_space()
    compass = ["north", "east", "south", "west"]
    sums = turns = 0
    for ex in all_examples("navigate"):
        *lines, final = ex.answer.split("\n")
        sentences = ex.prompt.split("? ", 1)[1].split("\n")[0].rstrip(".").split(". ")
        forward_mode = sentences[0] == "Always face forward"
        moves: dict[str, list[int]] = {}
        if forward_mode:
            for sentence in sentences[1:]:  # "Take 3 steps left"
                words = sentence.split()
                moves.setdefault(words[-1], []).append(int(words[1]))
            pairs = [("forward", "backward"), ("right", "left")]
        else:
            trace = lines.pop(0).rstrip(".").split(", ")
            assert trace.pop(0) == "north" and len(trace) == len(sentences), (sentences, trace)
            facing = "north"
            for sentence, item in zip(sentences, trace):
                instruction = sentence.split()
                if instruction[0] == "Turn":
                    shift = {"left": -1, "right": 1, "around": 2}[instruction[1]]
                    facing = compass[(compass.index(facing) + shift) % 4]
                    turns += 1
                else:
                    moves.setdefault(facing, []).append(int(instruction[1]))
                # a turn and the new facing, or the steps and the facing they go
                assert item == f"{instruction[1]} {facing}", (sentence, item)
            pairs = [("north", "south"), ("east", "west")]
        verdicts = []
        for (a, b), line in zip(pairs, lines, strict=True):
            halves = re.fullmatch(rf"{a} (.+), {b} (.+): (equal|differ)\.", line)
            assert halves, line
            for direction, chain in ((a, halves[1]), (b, halves[2])):
                numbers = [int(x) for x in re.findall(r"\d+", chain)]
                # its steps, in order
                assert numbers[:1] + numbers[1::2] == (moves.get(direction) or [0]), line
                total = numbers[0]
                for step, result in zip(numbers[1::2], numbers[2::2]):
                    assert f"{total} + {step}" in drilled and result == total + step, chain
                    total, sums = result, sums + 1
            equal = sum(moves.get(a, [])) == sum(moves.get(b, []))
            assert halves[3] == ("equal" if equal else "differ"), line
            verdicts.append(equal)
        assert final == f"So the answer is {'Yes' if all(verdicts) else 'No'}.", ex.answer
    assert sums > 1000 and turns > 300  # ~11,900 additions and ~6,500 turns over the splits


def test_arithmetic_columns():
    assert arithmetic.columns(47, "+", 35) == "47 + 35: 7 + 5 = 12, 4 + 3 + 1 = 8, 82"
    assert arithmetic.columns(42, "-", 17) == "42 - 17: 12 - 7 = 5, 4 - 1 - 1 = 2, 25"
    assert arithmetic.columns(36, "+", 7) == "36 + 7: 6 + 7 = 13, 3 + 0 + 1 = 4, 43"
    assert arithmetic.columns(14, "-", 9) == "14 - 9: 14 - 9 = 5, 1 - 0 - 1 = 0, 5"
    assert arithmetic.columns(7, "+", 36) == "7 + 36: 7 + 6 = 13, 0 + 3 + 1 = 4, 43"
    assert arithmetic.columns(23, "+", 14) == "23 + 14: 3 + 4 = 7, 2 + 1 = 3, 37"
    assert arithmetic.columns(58, "-", 23) == "58 - 23: 8 - 3 = 5, 5 - 2 = 3, 35"
    assert arithmetic.columns(10, "-", 4) == "10 - 4: 10 - 4 = 6, 1 - 0 - 1 = 0, 6"
    assert arithmetic.columns(8, "+", 5) == "8 + 5 = 13"
    assert arithmetic.columns(56, "/", 8) == "56 / 8 = 7"
    for bad in ((12, "*", 3), (60, "/", 5), (57, "/", 8), (60, "+", 45), (3, "-", 5), (-3, "+", 5)):
        with pytest.raises(ValueError):
            arithmetic.columns(*bad)


def test_arithmetic_facts_drill():
    """Training-only: right facts in the chain-line form, deterministic, and
    out of every benchmark path (not a task name, not in the tokenizer corpus)."""
    drill = get_training_task("arithmetic_facts")
    examples = drill.examples("train", 300, seed=0)
    assert examples == drill.examples("train", 300, seed=0)
    operators = Counter()
    for ex in examples:
        lines = ex.answer.split("\n")
        assert len(lines) == 12 and ex.prompt == ", ".join(line.split(" = ")[0] for line in lines)
        for line in lines:
            lhs, value = line.split(" = ")
            operators[lhs.split()[1]] += 1
            assert lhs in arithmetic_facts.fact_space()
            assert int(value) >= 0 and eval(lhs) == int(value)  # noqa: S307
        assert ex.target == lines[-1].split()[-1]
    assert set(operators) == {"+", "-", "*", "/"}
    assert len(arithmetic_facts.fact_space()) == 1116  # 100 + 100 + 100 + 45 + 81 + 81 + 690, less 81 shared
    assert [
        arithmetic_facts.value_of(lhs)
        for lhs in ("7 + 5", "4 + 3 + 1", "12 - 7", "4 - 1 - 1", "6 * 7", "42 / 6")
    ] == [12, 8, 5, 2, 42, 7]
    kinds_seen = {
        kind
        for ex in examples
        for line in ex.answer.split("\n")
        for kind, facts in arithmetic_facts.KINDS.items()
        if line.split(" = ")[0] in facts
    }
    assert kinds_seen == set(arithmetic_facts.KINDS)
    assert DRILL_NAMES == ("arithmetic_facts",) and "arithmetic_facts" not in TASK_NAMES
    with pytest.raises(InputError, match="'arithmetic_facts'"):
        get_task("arithmetic_facts")  # benchmarks and scoring never see it
    with pytest.raises(InputError, match=r"unknown training task 'nope'.*arithmetic_facts"):
        get_training_task("nope")
    assert get_training_task("navigate") is get_task("navigate")


def test_corpus_texts():
    texts = list(corpus_texts(3, seed=0))
    assert len(texts) == 3 * len(TASK_NAMES)
    assert all("So the answer is" in t for t in texts)


# --- the real BBH files: formats only (never used by the generators) -----------------------


def _bbh(name: str):
    path = BBH_DIR / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    return json.loads(path.read_text())["examples"]


def test_real_boolean_expressions_parse():
    space = set(all_expressions())
    for ex in _bbh("boolean_expressions"):
        assert re.fullmatch(FORMATS["boolean_expressions"], ex["input"])
        assert ex["input"][: -len(" is")] in space
        assert ex["target"] == str(eval(ex["input"][: -len(" is")]))  # noqa: S307


def test_real_web_of_lies_parse():
    for ex in _bbh("web_of_lies"):
        assert re.fullmatch(FORMATS["web_of_lies"], ex["input"])
        assert ex["target"] == ("Yes" if _web_of_lies_truth(ex["input"]) else "No")
