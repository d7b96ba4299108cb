"""CAI with Prophet's early exit (decode/policies/cai_prophet.py): on random LLaDA weights it is `cai` (no
cache) step for step until the answer's top-2 logit gap reaches the phase's threshold, read here from the
canvas of each step (not from the policy); at that step every mask left in the generation takes the
step's argmax and the request ends, as Prophet's. Without an answer position it is `cai`; batch
invariance; refusals naming the field. Random weights give gaps of ~0.05-0.4: the thresholds are scaled
down to fire."""

import pytest
import torch

from caidllm.errors import InputError
from helpers.decoding import PROMPTS, alone_static_joined, run

PROMPTS = PROMPTS[:3]
CASES = [((0.3, 0.2, 0.1), -5), ((1.0, 0.5, 0.1), 10), ((0.15, 0.1, 0.05), 3)]


@pytest.fixture
def lm(llada_lm):
    return llada_lm


def watch(answer_start, thresholds):
    return dict(answer_start=answer_start, early=thresholds[0], mid=thresholds[1], late=thresholds[2])


def gap_fires(lm, canvas, prompt_length, answer_start, step, total_steps, thresholds):
    """Prophet's watch written out (tests/prophet_reference.py's reading) on the canvas of global step
    `step`; also the step's argmax."""
    logits = lm.logits(torch.tensor([canvas]))[0].float()
    logits[:, lm.config.mask_id] = float("-inf")
    first = prompt_length + answer_start if answer_start >= 0 else len(canvas) + answer_start
    top2 = logits[first : min(first + 5, len(canvas))].topk(2, dim=-1).values
    progress = (step + 1) / total_steps
    threshold = thresholds[0] if progress < 0.33 else thresholds[1] if progress < 0.67 else thresholds[2]
    return float((top2[:, 0] - top2[:, 1]).mean()) >= threshold, logits.argmax(-1)


def canvas_before(prompt, result, step, mask_id):
    """The canvas at the start of global step `step`: the positions committed at earlier steps."""
    return prompt + [
        t if 0 <= s < step else mask_id for t, s in zip(result.token_ids, result.trace.commit_step)
    ]


@pytest.mark.parametrize("thresholds, answer_start", CASES)
def test_it_is_cai_until_the_gap_rule_fires_then_commits_everything(lm, thresholds, answer_start):
    fired = 0
    for prompt in PROMPTS:
        (mixed,) = run(lm, [prompt], "cai-prophet", cai_prophet=watch(answer_start, thresholds))
        (cai,) = run(lm, [prompt], "cai", cache="none")
        end = mixed.nfe - 1  # no cache: one forward a step, global steps from 0
        before = [(t, s) for t, s in zip(mixed.token_ids, mixed.trace.commit_step) if s < end]
        assert before == [(t, s) for t, s in zip(cai.token_ids, cai.trace.commit_step) if s < end]
        for step in range(end + 1):  # the watch is quiet before the last step (and fires there if it ended)
            canvas = canvas_before(prompt, mixed, step, lm.config.mask_id)
            fires, argmax = gap_fires(lm, canvas, len(prompt), answer_start, step, 16, thresholds)
            assert not fires if step < end else fires or mixed.nfe == cai.nfe
        if mixed.nfe < cai.nfe:  # the exit: every mask left took this step's argmax
            fired += 1
            filled = [p for p, s in enumerate(mixed.trace.commit_step) if s == end]
            assert [mixed.token_ids[p] for p in filled] == [int(argmax[len(prompt) + p]) for p in filled]
    assert fired >= 1


def test_without_an_answer_position_it_is_cai(lm):
    mixed = run(lm, PROMPTS, "cai-prophet", cai_prophet=dict(answer_start=None))
    cai = run(lm, PROMPTS, "cai", cache="none")
    assert [(r.token_ids, r.nfe) for r in mixed] == [(r.token_ids, r.nfe) for r in cai]


def test_cai_prophet_is_batch_invariant(lm):
    from caidllm.decode.presets import build_config

    watched = dict(cai_prophet=watch(-5, (0.3, 0.2, 0.1)))
    config = build_config("cai-prophet", gen_length=16, block_length=8, early_stop=False, **watched)
    alone, static, joined = alone_static_joined(lm, config, PROMPTS)
    assert alone == static == joined


@pytest.mark.parametrize(
    "given, field, words",
    [
        (dict(cai_prophet=dict(early=-1)), "cai_prophet", "cai_prophet.early must be a number >= 0"),
        (dict(cai_prophet=dict(theta_end=1.5)), "cai_prophet", "cai_prophet.theta_end must be in (0, 1]"),
        (dict(theta_end=0), "theta_end", "theta_end must be in (0, 1]"),
        (dict(cache="dual"), "cache", "policy 'cai-prophet' runs without a cache"),
    ],
)
def test_a_bad_setting_is_refused_by_name(lm, given, field, words):
    with pytest.raises(InputError) as error:
        run(lm, PROMPTS[:1], "cai-prophet", **given)
    assert error.value.field == field and words in str(error.value)
