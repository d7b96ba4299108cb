"""The KLASS decoder (decode/policies/klass.py): its greedy output equal, token for token, to a re-statement
of the official LLaDA loop (tests/klass_reference.py) on random LLaDA weights, its rule at work (fewer
forwards than the schedule, other tokens), batch invariance and its settings' refusals naming the field.
Random weights are far from confident (best probability ~0.04), so the tests lower the confidence
threshold to let the KL rule decide."""

import pytest

from caidllm.errors import InputError
from helpers.decoding import PROMPTS, alone_static_joined, run
from klass_reference import klass_reference

PROMPTS = PROMPTS[:3]
RULE_AT_WORK = [dict(conf_threshold=0.0, kl_threshold=0.01), dict(conf_threshold=0.04, kl_threshold=0.01)]


@pytest.fixture
def lm(llada_lm):
    return llada_lm


@pytest.mark.parametrize("settings", RULE_AT_WORK + [dict(conf_threshold=0.0, kl_threshold=0.01, history=3)])
def test_klass_matches_the_official_loop(lm, settings):
    for prompt in PROMPTS:
        (r,) = run(lm, [prompt], "vanilla", policy="klass", klass=settings)
        assert r.token_ids == klass_reference(
            lm,
            prompt,
            16,
            8,
            16,
            history=settings.get("history", 2),
            conf_threshold=settings["conf_threshold"],
            kl_threshold=settings["kl_threshold"],
        )


def test_the_first_step_reading_agrees_with_the_official_here(lm):
    # caidllm's forwards predict only the block: a block's first KL counts as unstable (the deviation table).
    for prompt in PROMPTS:
        args = (lm, prompt, 16, 8, 16, 0.0, 0.01, 2)
        assert klass_reference(*args, "official") == klass_reference(*args, "unknown")


def test_the_rule_commits_several_positions_a_step(lm):
    klass = run(lm, PROMPTS, "vanilla", policy="klass", klass=RULE_AT_WORK[0])
    vanilla = run(lm, PROMPTS, "vanilla")
    assert sum(r.nfe for r in klass) < sum(r.nfe for r in vanilla)
    assert any(k.token_ids != v.token_ids for k, v in zip(klass, vanilla))
    # At the official defaults (confidence above 0.9) random weights never qualify: the schedule decides.
    defaults = run(lm, PROMPTS, "vanilla", policy="klass")
    assert [r.token_ids for r in defaults] == [r.token_ids for r in vanilla]


def test_klass_is_batch_invariant(lm):
    from caidllm.decode.presets import build_config

    config = build_config(
        "vanilla", policy="klass", gen_length=16, block_length=8, early_stop=False, klass=RULE_AT_WORK[0]
    )
    alone, static, joined = alone_static_joined(lm, config, PROMPTS)
    assert alone == static == joined


@pytest.mark.parametrize(
    "field, value",
    [
        ("conf_threshold", 1.0),
        ("conf_threshold", -0.1),
        ("kl_threshold", 0),
        ("history", 0),
        ("history", 1.5),
    ],
)
def test_a_setting_out_of_range_is_refused_by_name(lm, field, value):
    with pytest.raises(InputError) as error:
        run(lm, PROMPTS[:1], "vanilla", policy="klass", klass={field: value})
    # the field as given (the owner's key) and the setting by its dotted name
    assert error.value.field == "klass" and str(error.value).startswith(f"klass.{field} must be")
