"""Structured output held over the whole canvas in any commit order (decode/constraints/): the automaton's
refusals, the any-order state sets against random commit orders, every committing decoder on the embedded
models, a decoder that commits the last position first, and batch invariance."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch

import caidllm
from caidllm.decode.constraints import Constraint
from caidllm.decode.constraints.automaton import compile_regex
from caidllm.decode.constraints.canvas import CanvasConstraint
from caidllm.decode.constraints.guide import canvas_constraint
from caidllm.decode.engine import Engine
from caidllm.decode.policies import POLICIES, PolicySpec
from caidllm.decode.presets import build_config
from caidllm.errors import InputError

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
}


@pytest.fixture(scope="module")
def tiny():
    return caidllm.load("tiny")


@pytest.fixture(scope="module")
def tiny_bd():
    return caidllm.load("tiny-bd")


def _automaton(lm, regex):
    return compile_regex(
        lm.tokenizer, regex, tuple(lm.config.eos_ids), lm.config.mask_id, "regex", lm.config.vocab_size
    )


def _fill_in_random_order(lm, state: CanvasConstraint, rng: random.Random) -> list[int]:
    order = list(range(state.length))
    rng.shuffle(order)
    for p in order:
        allowed = state.allowed(p).nonzero()[0].tolist()
        assert allowed, f"position {p} has no allowed token"
        state.commit(p, rng.choice(allowed))
    return state.tokens


def _answer(lm, tokens):
    end = next((i for i, t in enumerate(tokens) if t in lm.config.eos_ids), len(tokens))
    assert all(t in lm.config.eos_ids for t in tokens[end:])
    return lm.decode(tokens[:end])


@pytest.mark.parametrize("seed", range(6))
def test_any_order_commits_of_allowed_tokens_always_match_the_regex(tiny, seed):
    regex = r"\[(0|[1-9][0-9]?)(, (0|[1-9][0-9]?)){1,3}\]"
    state = CanvasConstraint(_automaton(tiny, regex), 24)
    text = _answer(tiny, _fill_in_random_order(tiny, state, random.Random(seed)))
    assert re.fullmatch(regex, text), text


@pytest.mark.parametrize("seed", range(4))
def test_any_order_commits_give_schema_valid_json(tiny, seed):
    lm = tiny
    state = canvas_constraint(
        lm, Constraint("json_schema", PERSON), build_config("vanilla", gen_length=48, block_length=48)
    )
    value = json.loads(_answer(lm, _fill_in_random_order(lm, state, random.Random(seed))))
    jsonschema.validate(value, PERSON)


def test_an_answer_that_cannot_fit_is_refused_with_its_length(tiny):
    with pytest.raises(
        InputError, match=r"json_schema: its shortest answer takes \d+ tokens, more than the 8"
    ):
        canvas_constraint(
            tiny, Constraint("json_schema", PERSON), build_config("vanilla", gen_length=8, block_length=8)
        )


@pytest.mark.parametrize(
    "constraint, message",
    [
        (Constraint("regex", "a["), "regex: cannot be compiled"),
        (Constraint("regex", "x[a&&b]"), "regex: cannot be compiled"),  # matches nothing
        (Constraint("regex", ""), "regex: a regex must be a non-empty string"),
        (Constraint("json_schema", {"type": "objec"}), "json_schema: the schema cannot be compiled"),
        (Constraint("json_schema", "{not json"), "json_schema: not valid JSON"),
        (Constraint("choice", []), "choice: a choice must be a non-empty list"),
    ],
)
def test_bad_constraints_are_refused_naming_the_field(tiny, constraint, message):
    with pytest.raises(InputError, match=re.escape(message)):
        Engine(tiny).submit(
            [3, 4], build_config("vanilla", gen_length=16, block_length=16), constraint=constraint
        )


def test_decoders_that_revise_committed_tokens_are_refused(tiny):
    with pytest.raises(InputError, match="policy 'wino' revises committed tokens"):
        Engine(tiny).submit(
            [7, 8],
            build_config("wino", gen_length=32, block_length=32),
            constraint=Constraint("regex", "[0-9]+"),
        )


def _run(lm, config, constraint=None, others=(), prompt="Give a person as JSON."):
    engine = Engine(lm)
    ids = lm.encode_chat(prompt)
    target = engine.submit(ids, config, constraint=constraint)
    for other_prompt, other_constraint in others:
        engine.submit(lm.encode_chat(other_prompt), config, constraint=other_constraint)
    return {e.request_id: e.result for e in engine.run() if e.finished}[target]


@pytest.mark.parametrize("method", ["vanilla", "fastdllm", "cai", "eb", "slowfast", "dkv-greedy"])
def test_every_committing_decoder_yields_schema_valid_json(tiny, method):
    config = build_config(method, gen_length=64, block_length=32)
    result = _run(tiny, config, Constraint("json_schema", PERSON))
    jsonschema.validate(json.loads(result.text), PERSON)


@pytest.mark.parametrize(
    "model, method", [("tiny-bd", "llada2"), ("tiny-bd", "sdar"), ("tiny-moe", "llada2")]
)
def test_block_diffusion_decoders_yield_schema_valid_json(model, method):
    lm = caidllm.load(model)
    config = build_config(method, gen_length=64, block_length=lm.config.block_lengths[0])
    result = _run(lm, config, Constraint("json_schema", PERSON))
    jsonschema.validate(json.loads(result.text), PERSON)


def _last_first(view):
    """Commits the rightmost masked position of each row: the canvas fills from its end."""
    index = torch.arange(view.masked.shape[1], device=view.masked.device)
    score = torch.where(view.masked, index, -1)
    return (score == score.amax(dim=1, keepdim=True)) & view.masked


def test_a_decoder_that_commits_the_last_position_first_still_yields_valid_json(tiny, monkeypatch):
    monkeypatch.setitem(POLICIES, "vanilla", PolicySpec(_last_first))  # the vanilla preset, this rule
    config = build_config("vanilla", gen_length=40, block_length=40)
    result = _run(tiny, config, Constraint("json_schema", PERSON))
    assert result.trace.commit_step[-1] == 0  # the last position went first
    jsonschema.validate(json.loads(result.text), PERSON)


def test_random_order_and_sampling_hold_a_regex(tiny):
    regex = r"(yes|no), because [a-z ]{3,20}\."
    for seed in range(3):
        config = build_config(
            "vanilla", gen_length=32, block_length=32, policy="random", temperature=1.0, seed=seed
        )
        assert re.fullmatch(regex, _run(tiny, config, Constraint("regex", regex)).text)


def test_a_choice_is_one_of_its_strings(tiny):
    choices = ["red (warm)", "blue", "a|b"]
    result = _run(tiny, build_config("cai", gen_length=16, block_length=16), Constraint("choice", choices))
    assert result.text in choices


def test_constrained_and_unconstrained_requests_get_in_a_batch_what_they_get_alone(tiny):
    config = build_config("cai", gen_length=64, block_length=32)
    alone_plain = _run(tiny, config, None, prompt="What is 3 + 4?")
    alone_json = _run(tiny, config, Constraint("json_schema", PERSON))
    together_json = _run(tiny, config, Constraint("json_schema", PERSON), others=[("What is 3 + 4?", None)])
    together_plain = _run(
        tiny,
        config,
        None,
        prompt="What is 3 + 4?",
        others=[("Give a person as JSON.", Constraint("json_schema", PERSON))],
    )
    assert together_json.token_ids == alone_json.token_ids
    assert together_plain.token_ids == alone_plain.token_ids


def test_generate_takes_a_schema_a_regex_or_a_choice_and_refuses_two(tiny):
    (result,) = tiny.generate(
        ["Give a person as JSON."],
        method="cai",
        gen_length=64,
        block_length=32,
        json_schema=json.dumps(PERSON),
    )
    jsonschema.validate(json.loads(result.text), PERSON)
    (result,) = tiny.generate(["3 + 4 is"], gen_length=16, block_length=16, regex="[0-9]{2}")
    assert re.fullmatch("[0-9]{2}", result.text)
    with pytest.raises(InputError, match="give one constraint, not json_schema and regex"):
        tiny.generate(["x"], gen_length=16, block_length=16, json_schema=PERSON, regex="a")


def test_cli_json_schema_and_its_refusals(tmp_path, capsys):
    from caidllm.cli import main

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(PERSON))
    assert (
        main(
            [
                "generate",
                "Give a person as JSON.",
                "--model",
                "tiny",
                "--json-schema",
                str(schema),
                "--gen-length",
                "64",
                "--block-length",
                "32",
                "--json",
            ]
        )
        == 0
    )
    jsonschema.validate(json.loads(json.loads(capsys.readouterr().out)["text"]), PERSON)
    assert main(["generate", "x", "--model", "tiny", "--json-schema", str(tmp_path / "missing.json")]) == 2
    assert "--json-schema" in capsys.readouterr().err
    assert (
        main(
            [
                "generate",
                "x",
                "--model",
                "tiny",
                "--regex",
                "x[a&&b]",
                "--gen-length",
                "16",
                "--block-length",
                "16",
            ]
        )
        == 2
    )
    assert "--regex: cannot be compiled" in capsys.readouterr().err


def test_schema_keywords_the_library_leaves_out_of_its_regex_are_refused(tiny):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]}
    with pytest.raises(InputError, match="json_schema: 'minimum' at properties.n cannot be held"):
        canvas_constraint(
            tiny, Constraint("json_schema", schema), build_config("vanilla", gen_length=32, block_length=32)
        )
    # a property that is merely named like a keyword is fine
    named = {"type": "object", "properties": {"minimum": {"type": "integer"}}, "required": ["minimum"]}
    canvas_constraint(
        tiny, Constraint("json_schema", named), build_config("vanilla", gen_length=32, block_length=32)
    )


def test_the_json_extraction_task_scores_validity_and_holds_each_sample_to_its_constraint(tiny):
    from caidllm.bench.tasks import load_task
    from caidllm.bench.tasks.structured import REGEXES, SCHEMAS, score_text

    for name, (schema, example) in SCHEMAS.items():  # every example is valid: the scorer is right
        assert score_text(json.dumps(example), ("schema", name)).score == 1.0
        assert score_text(json.dumps(example)[:-1], ("schema", name)).score == 0.0
    for name, (regex, example) in REGEXES.items():
        assert score_text(example, ("regex", name)).score == 1.0
    task = load_task("json-extraction", limit=35)
    free = load_task("json-extraction:free", limit=35)
    assert free.constraint_for is None and [s.prompt for s in free.samples] == [
        s.prompt for s in task.samples
    ]
    picked = [task.samples[0], task.samples[30], task.samples[34]]  # a schema and two regexes
    results = tiny.generate(
        [s.prompt for s in picked],
        method="cai",
        gen_length=64,
        block_length=32,
        constraint=[task.constraint_for(s) for s in picked],
    )
    assert all(task.score(r.text, s).score == 1.0 for r, s in zip(results, picked))
    with pytest.raises(InputError, match="constraint: 1 constraints for 2 prompts"):
        tiny.generate(["a", "b"], gen_length=16, block_length=16, constraint=[None])


@pytest.mark.parametrize("seed", range(3))
def test_holes_committed_together_in_one_step_do_not_clash(tiny, seed):
    # One step commits the whole canvas: each hole alone allows 'x' and 'y', together they must agree.
    regex = "(xxxxxxxx|yyyyyyyy)"
    config = build_config("vanilla", gen_length=8, block_length=8, steps=1, temperature=1.0, seed=seed)
    result = _run(tiny, config, Constraint("regex", regex))
    assert result.nfe == 1 and re.fullmatch(regex, result.text), result.text
