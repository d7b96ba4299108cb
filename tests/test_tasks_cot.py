"""The long worked answers of tiny-cot: deterministic, right by an independent solver,
within their lengths, in the tiny-cot tokenizer; tiny's tasks and tokenizer untouched."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from tokenizers import Tokenizer

from caidllm.tasks import CHOICE_NAMES, COT_NAMES, SPLITS, TASK_NAMES, get_task, score, split_of
from caidllm.tasks.base import count_tokens
from caidllm.tasks.vocab import build_tokenizer

ASSETS = __import__("pathlib").Path(__file__).parent.parent / "src" / "caidllm" / "assets"
TRACKING = {f"tracking_shuffled_objects_{c}_objects": n for c, n in (("three", 3), ("five", 5), ("seven", 7))}
# 100 to 400 tokens, every draw; the other cot variants are as long as their inputs allow.
LONG = tuple(TRACKING) + ("multistep_arithmetic_cot",)


def _tracking_truth(prompt: str) -> str:
    """Simulate the swaps read off the prompt's sentences; the letter of the asked object."""
    intro, rest = prompt.split("\n", 1)
    people = re.match(r"([A-Z]\w+(?:, [A-Z]\w+)*),? and ([A-Z]\w+) ", intro)
    names = people.group(1).split(", ") + [people.group(2)]
    options = re.findall(r"^\(([A-G])\) (.+)$", prompt, re.M)
    held = {}
    for name, (_, obj) in zip(names, options):
        assert obj in intro  # given out in the options' order
        held[name] = obj
    for a, b in re.findall(r"(?:First|Then|Finally), (\w+) and (\w+) ", rest):
        held[a], held[b] = held[b], held[a]
    asked = re.search(r"At the end of the \w+, (\w+) ", rest).group(1)
    return "(" + next(letter for letter, obj in options if obj == held[asked]) + ")"


def _web_of_lies_truth(prompt: str) -> str:
    truthful = "tells the truth" in prompt.split(".")[0]
    for said in re.findall(r"says \w+ (tells the truth|lies)\.", prompt):
        truthful = truthful == (said == "tells the truth")
    return "Yes" if truthful else "No"


def _navigate_truth(prompt: str) -> str:
    x = y = 0
    facing = 0  # north, clockwise
    for turn, n, direction in re.findall(r"Turn (\w+)|Take (\d+) steps?(?: (\w+))?\.", prompt):
        if turn:
            facing = (facing + {"left": 3, "right": 1, "around": 2}[turn]) % 4
            continue
        heading = ["forward", "right", "backward", "left"].index(direction) if direction else facing
        dx, dy = [(0, 1), (1, 0), (0, -1), (-1, 0)][heading]
        x, y = x + dx * int(n), y + dy * int(n)
    return "Yes" if (x, y) == (0, 0) else "No"


SOLVERS = {
    **{name: _tracking_truth for name in TRACKING},
    "web_of_lies_cot": _web_of_lies_truth,
    "boolean_expressions_cot": lambda p: str(eval(p.removesuffix(" is"))),  # Python's own and/or/not
    "multistep_arithmetic_cot": lambda p: str(eval(p.removesuffix(" ="))),
    "navigate_cot": _navigate_truth,
}


def test_the_cot_tasks_are_apart_from_tinys():
    assert set(SOLVERS) == set(COT_NAMES) and not set(COT_NAMES) & set(TASK_NAMES)
    assert CHOICE_NAMES == tuple(TRACKING)


@pytest.mark.parametrize("name", COT_NAMES)
def test_deterministic_per_seed(name):
    task = get_task(name)
    assert task.examples("train", 5, seed=3) == task.examples("train", 5, seed=3)
    assert task.example(7) == task.example(7)
    assert task.examples("train", 5, seed=3) != task.examples("train", 5, seed=4)


@pytest.mark.parametrize("name", COT_NAMES)
def test_worked_answers_end_in_the_independently_solved_answer(name):
    for split in SPLITS:
        for ex in get_task(name).examples(split, 40, seed=1):
            truth = SOLVERS[name](ex.prompt)
            assert ex.target == truth, ex.prompt
            assert ex.answer.splitlines()[-1] == f"So the answer is {truth}."
            assert score(name, ex.answer, ex.target)


@pytest.mark.parametrize("name", LONG)
def test_long_tasks_are_100_to_400_tokens(name):
    lengths = [count_tokens(ex.answer) for ex in get_task(name).examples("train", 60, seed=2)]
    assert 100 <= min(lengths) and max(lengths) <= 400
    if name.endswith(("five_objects", "seven_objects")):
        assert statistics.median(lengths) >= 150  # issue 47's aim for tracking five and seven


@pytest.mark.parametrize("name", sorted(set(COT_NAMES) - set(LONG)))
def test_other_cot_answers_fit_the_long_canvas(name):
    assert max(count_tokens(ex.answer) for ex in get_task(name).examples("train", 60, seed=2)) <= 400


def test_tracking_state_lines_list_every_person_after_every_swap():
    for name, n in TRACKING.items():
        ex = get_task(name).example(0)
        lines = ex.answer.splitlines()
        assert lines[0].startswith("Start: ") and len(lines) == n + 3  # start, n swaps, end, answer
        for line in lines[: n + 1]:
            state = line.split(": ", 1)[1]
            assert state.count(",") == n - 1


def test_tracking_prompts_keep_bbhs_format():
    prompt = get_task("tracking_shuffled_objects_three_objects").example(0).prompt
    assert prompt.startswith("Alice, Bob, and Claire ") and "\nOptions:\n(A) " in prompt
    assert re.search(r"First, \w+ and \w+ .*Then, .*Finally, ", prompt)


@pytest.mark.parametrize(
    "text, right",
    [
        ("...\nSo the answer is (B).", True),
        ("So the answer is B.", True),
        ("So the answer is (B) Frankenstein.", True),
        ("So the answer is (C).", False),
        ("So the answer is Frankenstein.", False),
        ("no answer line\nat all", False),
    ],
)
def test_choice_answers_are_scored_by_their_letter_as_the_bench_does(text, right):
    assert score("tracking_shuffled_objects_five_objects", text, "(B)") is right


def test_cot_variants_share_their_familys_split():
    for name, family in (("navigate_cot", "navigate"), ("web_of_lies_cot", "web_of_lies")):
        for split in SPLITS:
            for ex in get_task(name).examples(split, 20, seed=0):
                assert split_of(family, ex.prompt) == split


@pytest.fixture(scope="module")
def cot_tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("cot_tok")
    ids = build_tokenizer(out, vocabulary="tiny-cot")
    return ids, Tokenizer.from_file(str(out / "tokenizer.json")), out


def test_the_cot_vocabulary_extends_tinys(cot_tokenizer):
    ids, _, out = cot_tokenizer
    tiny = json.loads((ASSETS / "tiny" / "tokenizer.json").read_text())["model"]["vocab"]
    cot = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert cot[: len(tiny)] == tiny and len(cot) > len(tiny) and ids["vocab_size"] == len(cot)


def test_every_piece_of_the_cot_tasks_is_one_token(cot_tokenizer):
    _, tok, _ = cot_tokenizer
    for name in COT_NAMES:
        for ex in get_task(name).examples("test", 40, seed=9):
            for text in (ex.prompt, ex.answer):
                ids = tok.encode(text).ids
                assert tok.decode(ids) == text and len(ids) == count_tokens(text)


def test_the_bench_loads_a_tracking_task_and_scores_its_letters():
    from caidllm.bench.tasks.synthetic import load

    task = load("tracking_shuffled_objects_five_objects", limit=3, seed=0)
    sample = task.samples[0]
    assert len(task.samples) == 3 and re.fullmatch(r"\([A-E]\)", sample.reference)
    assert task.scorer(f"So the answer is {sample.reference[1]}.", sample).score == 1.0
    assert task.scorer("So the answer is (F).", sample).score == 0.0
