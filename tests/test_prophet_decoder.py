"""The Prophet decoder (decode/policies/prophet.py): its greedy tokens and forward counts equal to a
re-statement of the official LLaDA loop (tests/prophet_reference.py) on random LLaDA weights, the early exit
filling every later block at once, batch invariance (rows joining mid-flight at other blocks included) and
its refusals naming the field. Random weights give top-2 logit gaps of ~0.05-0.4, so the tests scale the
thresholds down to make the exit fire at every phase."""

import pytest

from caidllm.errors import InputError
from helpers.decoding import PROMPTS, alone_static_joined, run
from prophet_reference import prophet_reference

PROMPTS = PROMPTS[:3]
CASES = [
    ((7.5, 5.0, 2.5), -5),
    ((0.3, 0.2, 0.1), -5),
    ((0.3, 0.2, 0.1), 10),
    ((0.15, 0.1, 0.05), 3),
    ((1.0, 0.5, 0.1), 10),
    ((1.0, 0.5, 0.1), 30),
]


@pytest.fixture
def lm(llada_lm):
    return llada_lm


def settings(thresholds, answer_start):
    return dict(answer_start=answer_start, early=thresholds[0], mid=thresholds[1], late=thresholds[2])


@pytest.mark.parametrize("thresholds, answer_start", CASES)
def test_prophet_matches_the_official_loop(lm, thresholds, answer_start):
    for prompt in PROMPTS:
        (r,) = run(lm, [prompt], "vanilla", policy="prophet", prophet=settings(thresholds, answer_start))
        tokens, forwards = prophet_reference(lm, prompt, 16, 8, 16, answer_start, thresholds)
        assert (r.token_ids, r.nfe) == (tokens, forwards)


def test_the_exit_fills_later_blocks_and_without_an_answer_position_it_is_llada(lm):
    early = run(lm, PROMPTS, "vanilla", policy="prophet", prophet=settings((0.15, 0.1, 0.05), 3))
    assert any(r.nfe < 8 for r in early)  # ended inside the first block: the second was filled at once
    plain = run(lm, PROMPTS, "vanilla", policy="prophet")  # answer_start None: never exits
    assert [r.token_ids for r in plain] == [r.token_ids for r in run(lm, PROMPTS, "vanilla")]


def test_prophet_is_batch_invariant(lm):
    from caidllm.decode.presets import build_config

    for thresholds in [(0.3, 0.2, 0.1), (1.0, 0.5, 0.1)]:
        config = build_config(
            "vanilla",
            policy="prophet",
            gen_length=16,
            block_length=8,
            early_stop=False,
            prophet=settings(thresholds, -5),
        )
        alone, static, joined = alone_static_joined(lm, config, PROMPTS)
        assert alone == static == joined


@pytest.mark.parametrize("field, value", [("early", -1), ("late", "x"), ("answer_start", 1.5)])
def test_a_setting_out_of_range_is_refused_by_name(lm, field, value):
    with pytest.raises(InputError) as error:
        run(lm, PROMPTS[:1], "vanilla", policy="prophet", prophet={field: value})
    assert error.value.field == "prophet" and str(error.value).startswith(f"prophet.{field} must be")


def test_prophet_refuses_a_cache(lm):
    with pytest.raises(InputError, match="runs without a cache") as error:
        run(lm, PROMPTS[:1], "fastdllm", policy="prophet")
    assert error.value.field == "cache"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--method", "klass", "--set", "klass.kl_threshold=0"], "klass.kl_threshold must be a number > 0"),
        (["--method", "prophet", "--set", "prophet.early=-1"], "prophet.early must be a number >= 0"),
        (["--method", "prophet", "--cache", "dual"], "policy 'prophet' runs without a cache"),
    ],
)
def test_the_command_line_refuses_with_exit_2(argv, words, capsys):
    from caidllm.cli import main

    assert main(["generate", "--model", "tiny", *argv, "hi"]) == 2
    assert words in capsys.readouterr().err
