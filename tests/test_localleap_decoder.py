"""The LocalLeap decoder (decode/policies/localleap.py): its greedy tokens and forward counts equal to a
re-statement of the official LLaDA loop (tests/localleap_reference.py) on random LLaDA weights and on `tiny`
at the official defaults, the leap at work (fewer forwards than without it; without it Fast-dLLM's rule),
batch invariance on LLaDA and Dream, and its refusals naming the field. Random weights are far from
confident (best probability ~0.04), so those cases scale the thresholds down to make anchors appear."""

import pytest

from caidllm.decode.policies.localleap import near
from caidllm.errors import InputError
from helpers.decoding import PROMPTS, alone_static_joined, run
from localleap_reference import localleap_reference

PROMPTS = PROMPTS[:3]
CASES = [(0.05, 0.03, 1), (0.04, 0.03, 2), (0.045, 0.035, 1), (0.04, None, 2), (0.9, 0.75, 4)]


def settings(threshold, relaxed, radius):
    return dict(threshold=threshold, localleap=dict(relaxed_threshold=relaxed, radius=radius))


@pytest.mark.parametrize("threshold, relaxed, radius", CASES)
def test_localleap_matches_the_official_loop(llada_lm, threshold, relaxed, radius):
    for prompt in PROMPTS:
        (r,) = run(llada_lm, [prompt], "localleap", **settings(threshold, relaxed, radius))
        expected = localleap_reference(llada_lm, prompt, 16, 8, threshold, relaxed, radius)
        assert (r.token_ids, r.nfe) == expected


def test_localleap_matches_the_official_loop_on_tiny_at_its_defaults():
    import caidllm

    lm = caidllm.load("tiny", device="cpu", dtype="float32")
    questions = [
        "not ( True ) and ( True ) is",
        "True and not False or False is",
        "not not ( False ) or True is",
    ]
    leaps = 0
    for question in questions:
        prompt = lm.encode_chat(question)
        (r,) = lm.generate([prompt], method="localleap", gen_length=64, block_length=32, early_stop=False)
        assert (r.token_ids, r.nfe) == localleap_reference(lm, prompt, 64, 32, 0.9, 0.75, 4)
        leaps += r.nfe < localleap_reference(lm, prompt, 64, 32, 0.9, None, 4)[1]
    assert leaps >= 1  # the relaxed neighbourhood saved a forward somewhere


def test_the_leap_saves_forwards_and_without_it_is_fastdllm(llada_lm):
    leap = run(llada_lm, PROMPTS, "localleap", **settings(0.04, 0.03, 2))
    plain = run(llada_lm, PROMPTS, "localleap", **settings(0.04, None, 2))
    assert sum(r.nfe for r in leap) < sum(r.nfe for r in plain)
    fastdllm = run(llada_lm, PROMPTS, "fastdllm", cache="none", threshold=0.04)
    assert [(r.token_ids, r.nfe) for r in plain] == [(r.token_ids, r.nfe) for r in fastdllm]


def test_the_neighbourhood_of_the_anchors():
    import torch

    anchors = torch.tensor([[0, 0, 0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert near(anchors, 1).int().tolist() == [[0, 0, 1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 1, 1]]
    assert near(anchors, 0).tolist() == anchors.tolist()
    assert near(anchors, 20).all()


def test_localleap_is_batch_invariant(lm):
    from caidllm.decode.presets import build_config

    config = build_config(
        "localleap", gen_length=16, block_length=8, early_stop=False, **settings(0.04, 0.03, 2)
    )
    alone, static, joined = alone_static_joined(lm, config, PROMPTS)
    assert alone == static == joined


@pytest.mark.parametrize(
    "given, field, words",
    [
        (dict(localleap=dict(radius=-1)), "localleap", "localleap.radius must be an integer >= 0"),
        (dict(localleap=dict(radius=1.5)), "localleap", "localleap.radius must be an integer >= 0"),
        (dict(localleap=dict(relaxed_threshold=0)), "localleap", "localleap.relaxed_threshold must be in"),
        (dict(threshold=1.5), "threshold", "threshold must be in (0, 1]"),
        (
            dict(threshold=0.5),
            "threshold",
            "localleap.relaxed_threshold (0.75) must not exceed localleap.threshold (0.5)",
        ),
        (
            dict(localleap=dict(relaxed_threshold=0.95)),
            "localleap",
            "localleap.relaxed_threshold (0.95) must not exceed localleap.threshold (0.9)",
        ),
    ],
)
def test_a_bad_setting_is_refused_by_name(llada_lm, given, field, words):
    with pytest.raises(InputError) as error:
        run(llada_lm, PROMPTS[:1], "localleap", **given)
    assert error.value.field == field and words in str(error.value)


def test_the_command_line_refuses_with_exit_2(capsys):
    from caidllm.cli import main

    argv = ["generate", "--model", "tiny", "--method", "localleap", "--set", "localleap.radius=-2", "hi"]
    assert main(argv) == 2
    assert "localleap.radius must be an integer >= 0" in capsys.readouterr().err
