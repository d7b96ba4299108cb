"""Task generators and scorers: determinism, disjoint splits, formats, and
answers checked against independent solvers written here from the inputs."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from caidllm.errors import InputError
from caidllm.tasks import (
    DRILL_NAMES,
    SPLITS,
    TASK_NAMES,
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
    "web_of_lies": rf"Question: (\w+) {_STATUS}\.(?: (\w+) says (\w+) {_STATUS}\.){{4}} Does (\w+) tell the truth\?",
    "navigate": (
        r"If you follow these instructions, do you return to the starting point\? "
        rf"(?:Always face forward\.(?: {_NAV_STEP} (?:forward|backward|left|right)\.)+"
        rf"|(?:Turn (?:left|right|around)\.|{_NAV_STEP}\.)(?: (?:Turn (?:left|right|around)\.|{_NAV_STEP}\.))*)"
        r"\nOptions:\n- Yes\n- No"
    ),
    "dyck_languages": (
        r"Complete the rest of the sequence, making sure that the parentheses are closed properly\. "
        r"Input: [(\[{<)\]}>](?: [(\[{<)\]}>])*"
    ),
    "multistep_arithmetic_two": r"\(\((-?\d(?: [-+*] -?\d){3})\) [-+*] \((-?\d(?: [-+*] -?\d){3})\)\) =",
    "arithmetic": r"[A-Z][^\n]*\?",
}


@lru_cache(maxsize=None)
def split_examples(task: str, split: str, n: int = 1500):
    return tuple(get_task(task).examples(split, n, seed=0))


def all_examples(task: str):
    return [ex for split in SPLITS for ex in split_examples(task, split)]


# --- API and bad input ---------------------------------------------------------------------

def test_task_names():
    assert TASK_NAMES == ("boolean_expressions", "web_of_lies", "navigate", "dyck_languages",
                          "multistep_arithmetic_two", "arithmetic")


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
                words[-1], (dx, dy))
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


def test_arithmetic_lines():
    steps = Counter()
    for ex in all_examples("arithmetic"):
        lines = ex.answer.split("\n")[:-1]
        steps[len(lines)] += 1
        for line in lines:
            a, op, b, eq, c = line.split()
            assert eq == "=" and int(c) > 0
            assert eval(f"{a} {op} {b}") == int(c)  # noqa: S307 (checked digits and one operator)
        assert lines[-1].split()[-1] == ex.target
    assert set(steps) == {1, 2, 3}


def test_arithmetic_facts_drill():
    """Training-only: right facts in the chain-line form, deterministic, and
    out of every benchmark path (not a task name, not in the tokenizer corpus)."""
    drill = get_training_task("arithmetic_facts")
    examples = drill.examples("train", 300, seed=0)
    assert examples == drill.examples("train", 300, seed=0)
    operators = Counter()
    for ex in examples:
        lines = ex.answer.split("\n")
        assert len(lines) == 8 and ex.prompt == ", ".join(line.split(" = ")[0] for line in lines)
        for line in lines:
            a, op, b, eq, c = line.split()
            operators[op] += 1
            assert eq == "=" and int(c) >= 0 and eval(f"{a} {op} {b}") == int(c)  # noqa: S307
        assert ex.target == lines[-1].split()[-1]
    assert set(operators) == {"+", "-", "*", "/"}
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
