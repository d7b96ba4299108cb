"""diffusiongemma-cai: CAI-style per-position acceptance for the uniform-state decoders
(decode/diffusiongemma_cai.py): what it accepts, its schedules, budgets and exits, bad settings, and
batch invariance."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers.models.diffusion_gemma")

from caidllm.decode.diffusiongemma_cai import CaiUniformRule, entropy_bound_at
from caidllm.decode.diffusiongemma_rule import EntropyBoundRule, StepDraws
from caidllm.decode.diffusiongemma_settings import build_settings
from caidllm.decode.uniform_decoders import UNIFORM_DECODERS
from caidllm.decode.uniform_engine import UniformEngine
from caidllm.errors import InputError
from helpers.dg_reference import engine_lm, reference, run_engine

CAI = "diffusiongemma-cai"


def _request(step=0, canvas=0, steps=48, **dgcai):
    settings = build_settings(CAI, dgcai=dgcai, max_denoising_steps=steps).validate(16)
    return SimpleNamespace(settings=settings, step=step, steps_per_canvas=[0] * canvas, rule_state=None)


def _draws(entropy):
    entropy = torch.tensor(entropy, dtype=torch.float32)
    n = entropy.shape[0]
    return StepDraws(tokens=torch.arange(n) + 100, argmax=torch.arange(n) + 200, entropy=entropy)


def test_an_easy_canvas_gets_more_positions_at_its_first_step_than_the_official_bound():
    easy = _draws([0.03] * 12 + [3.0] * 4)  # twelve easy positions, four hard ones
    official, _ = EntropyBoundRule().accept(_request(), easy)
    ours, tokens = CaiUniformRule().accept(_request(), easy)
    assert int(official.sum()) == 4  # 0.03 * 3 <= 0.1 < 0.03 * 4: the cumulative bound stops there
    assert ours[:12].all() and not ours[12:].any()  # each easy one under its own bound; the hard ones not
    assert tokens[:12].tolist() == easy.tokens[:12].tolist()  # accepted with their sample
    assert bool((ours | ~official).all())  # everything the official rule accepts is accepted


def test_it_never_accepts_beyond_the_canvas():
    r = _request(entropy_start=100.0, entropy_end=100.0)
    accept, tokens = CaiUniformRule().accept(r, _draws([5.0] * 16))
    assert accept.shape == (16,) and int(accept.sum()) == 16 and tokens.shape == (16,)
    lm = engine_lm(reference(seed=4, canvas_length=8))
    [result] = run_engine(
        lm, [[5, 6, 7]], 2, 13, method=CAI, dgcai=dict(entropy_start=100.0, entropy_end=100.0)
    )
    assert len(result.token_ids) <= 13 and len(result.steps_per_block) <= 2


def test_the_bound_holds_through_the_warmup_then_relaxes_and_relaxes_more_on_later_canvases():
    c = _request().settings.decoder_settings
    bounds = [entropy_bound_at(c, t, 48, 0) for t in range(48)]
    assert bounds[:8] == [c.entropy_start] * 8  # 0.15 * 48 = 7.2: steps 0-7
    assert all(a <= b for a, b in zip(bounds, bounds[1:])) and bounds[-1] == pytest.approx(c.entropy_end)
    later = [entropy_bound_at(c, t, 48, 1) for t in range(48)]
    assert later[-1] == pytest.approx(c.entropy_end + c.canvas_relax) and later[8] > bounds[8]
    assert entropy_bound_at(c, 47, 48, 10) == pytest.approx(c.entropy_end_cap)
    c.canvas_schedule = False
    assert entropy_bound_at(c, 47, 48, 3) == pytest.approx(c.entropy_end)


def test_budgets_force_easy_positions_with_their_argmax_and_leave_hard_ones():
    first = _draws([0.2] * 8 + [1.0] * 4 + [3.0] * 4)  # easy in the first half, normal, hard
    rule, r = CaiUniformRule(), _request(entropy_start=0.0, entropy_end=0.0)
    rule.accept(r, first)  # the first step fixes the budgets (easy: ceil(48 / 6) = 8, normal: 32)
    late = _draws([4.0] * 15 + [3.9])  # under no bound but the official minimum of one (the last)
    for step, expected in ((7, 0), (8, 8), (32, 12), (47, 12)):
        r.step = step
        accept, tokens = rule.accept(r, late)
        assert bool(accept[15]) and int(accept[:15].sum()) == expected, step
        forced = accept[:15]
        assert tokens[:15][forced].tolist() == late.argmax[:15][forced].tolist()
    r.settings.decoder_settings.gating = False
    assert rule.accept(r, late)[0].nonzero().flatten().tolist() == [15]


def test_a_first_step_accepts_more_in_the_engine_and_the_draws_stay_the_official_ones():
    """Same seed, same first-step draws: CAI's accepted set holds the official one and more."""
    lm = engine_lm(reference(seed=4, canvas_length=16))
    seen = {}
    for method in ("diffusiongemma", CAI):
        rule = UNIFORM_DECODERS[method].rule
        engine = UniformEngine(lm, max_batch=1)
        dgcai = dict(dgcai=dict(entropy_start=1.0, entropy_end=1.0)) if method == CAI else {}
        engine.submit(
            [5, 6, 7], build_settings(method, gen_length=16, seed=1, t_max=0.08, t_min=0.04, **dgcai)
        )
        original = rule.accept
        rule.accept = lambda r, d, original=original: seen.setdefault(method, original(r, d))
        try:
            engine.step()
        finally:
            del rule.accept
    (official, _), (ours, _) = seen["diffusiongemma"], seen[CAI]
    assert int(ours.sum()) > int(official.sum()) >= 1 and bool((ours | ~official).all())


def test_stopping_still_works_and_the_grinding_exit_ends_a_canvas():
    lm = engine_lm(reference(seed=4, canvas_length=8))
    knobs = dict(stability_threshold=0, confidence_threshold=5.0)
    [stopped] = run_engine(lm, [[5, 6, 7]], 0, 16, method=CAI, **knobs)
    assert stopped.steps_per_block == [1, 1]  # the official stable-and-confident stop
    grind = dict(grinding_yield=1.0, grinding_patience=2, fallback_entropy=100.0)
    cold = dict(adaptive_stop=False, t_max=0.02, t_min=0.01)  # an argmax that barely moves: low yield
    [ground] = run_engine(lm, [[5, 6, 7]], 0, 16, method=CAI, dgcai=grind, **cold)
    assert all(3 <= n < 10 for n in ground.steps_per_block)  # two low-yield steps after the first at least
    grind["fallback_entropy"] = 1e-6  # the mean entropy never under it: no exit
    [held] = run_engine(
        lm, [[5, 6, 7]], 0, 16, method=CAI, adaptive_stop=False, max_denoising_steps=6, dgcai=grind
    )
    assert held.steps_per_block == [6, 6]
    [off] = run_engine(lm, [[5, 6, 7]], 0, 16, method=CAI, dgcai=dict(grinding=False), **cold)
    assert off.steps_per_block == [48, 48]


def test_the_grinding_exit_counts_low_yield_steps_in_a_row():
    rule = CaiUniformRule()
    r = _request(grinding_yield=0.1, grinding_patience=2, fallback_entropy=1.0)
    r.settings.adaptive_stop = False
    r.argmax = torch.arange(16)
    calm, entropy = torch.arange(16), [0.5] * 16
    moved = torch.arange(16).roll(1)  # every position changed
    rule.accept(r, _draws(entropy))
    stops = []
    for step, argmax in enumerate([moved, calm, moved, calm, calm, calm]):
        r.step = step
        stops.append(rule.stop(r, StepDraws(argmax, argmax, torch.tensor(entropy))))
        r.argmax = argmax
    # step 0 not counted (against the random canvas); 1-3 each change every position; 4 and 5 change none
    # (low: fewer than 0.1 * 16): the second low step in a row ends the canvas
    assert stops == [False, False, False, False, False, True]
    r.step, r.rule_state.low_steps = 6, 5
    assert not rule.stop(r, StepDraws(calm, calm, torch.tensor([2.0] * 16)))  # mean entropy over fallback


@pytest.mark.parametrize(
    "options,field",
    [
        (dict(dgcai=dict(warmup=1.5)), "dgcai.warmup"),
        (dict(dgcai=dict(entropy_start=-1)), "dgcai.entropy_start"),
        (dict(dgcai=dict(entropy_start=2.0, entropy_end=1.0)), "dgcai.entropy_start"),
        (dict(dgcai=dict(easy_entropy=3.0, hard_entropy=2.0)), "dgcai.easy_entropy"),
        (dict(dgcai=dict(factors=(1, 1, 1))), "dgcai.factors"),
        (dict(dgcai=dict(budget_fractions=(0.0, 0.5))), "dgcai.budget_fractions"),
        (dict(dgcai=dict(budget_fractions=(0.5, 0.2))), "dgcai.budget_fractions"),
        (dict(dgcai=dict(grinding_patience=0)), "dgcai.grinding_patience"),
        (dict(dgcai=dict(gating="yes")), "dgcai.gating"),
        (dict(dgcai=dict(theta_start=0.9)), "dgcai.theta_start"),
        (dict(dgcai="fast"), "dgcai"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(options, field):
    with pytest.raises(InputError) as error:
        build_settings(CAI, **options).validate(8)
    assert error.value.field == field and field in str(error.value)


def test_its_settings_are_refused_on_the_other_decoders():
    with pytest.raises(InputError, match="'dgcai'"):
        build_settings("diffusiongemma", dgcai=dict(warmup=0.1))


def test_a_seeded_request_is_the_same_alone_batched_and_joining_mid_flight():
    lm = engine_lm(reference(seed=4, canvas_length=8))
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
    knobs = dict(exact_seed=False, t_max=0.1, t_min=0.05, dgcai=dict(entropy_start=0.5, grinding_patience=2))
    alone = [run_engine(lm, [p], 3, 24, method=CAI, **knobs)[0] for p in prompts]
    together = run_engine(lm, prompts, 3, 24, method=CAI, **knobs)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.steps_per_block for r in together] == [r.steps_per_block for r in alone]
    engine = UniformEngine(lm, max_batch=3)
    first = engine.submit(prompts[0], build_settings(CAI, gen_length=24, seed=3, **knobs))
    engine.step(), engine.step()
    late = engine.submit(prompts[1], build_settings(CAI, gen_length=24, seed=3, **knobs))
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert results[first].token_ids == alone[0].token_ids and results[late].token_ids == alone[1].token_ids


def _drafts(method, **knobs):
    lm = engine_lm(reference(seed=4, canvas_length=8))
    engine = UniformEngine(lm, max_batch=1)
    settings = build_settings(method, gen_length=8, seed=3, stream_draft=True, adaptive_stop=False, **knobs)
    engine.submit([5, 6, 7], settings)
    return [e.draft for e in engine.run()]


def test_the_draft_stream_says_which_positions_each_rule_accepted_and_the_tokens_they_kept():
    """diffusiongemma-cai forcing every position of the first three quarters from step 1 on (no position
    hard, budgets at step 1): those are accepted with the argmax (the draft's token there); the official
    rule with a bound that accepts everything keeps its samples, which are not all the argmax."""
    forced = dict(hard_entropy=100.0, easy_entropy=0.0, budget_fractions=(0.01, 0.01))
    drafts = _drafts(CAI, max_denoising_steps=4, dgcai=forced)
    assert [d["step"] for d in drafts] == [1, 2, 3, 4]
    for d in drafts:
        assert len(d["kept"]) == len(d["accepted"])
    for d in drafts[1:]:
        kept = dict(zip(d["accepted"], d["kept"]))
        assert set(range(6)) <= set(kept) and [kept[i] for i in range(6)] == d["tokens"][:6]
    drafts = _drafts("diffusiongemma", max_denoising_steps=2, entropy_bound=1e6)
    assert all(d["accepted"] == list(range(8)) for d in drafts)
    assert any(d["kept"] != d["tokens"] for d in drafts)  # samples, not the argmax


def test_a_stability_threshold_past_the_steps_allocates_no_more_than_the_steps():
    """A stability_threshold above max_denoising_steps can never be met (as one equal to it): the history
    keeps at most max_denoising_steps rows, so 10**12 (a request's [k, canvas] history would not fit in
    memory) decodes as 3 does, and as no adaptive stop at all."""
    lm = engine_lm(reference(seed=4, canvas_length=8))
    knobs = dict(max_denoising_steps=3, confidence_threshold=50.0)
    huge = run_engine(lm, [[5, 6, 7]], 2, 16, stability_threshold=10**12, **knobs)
    equal = run_engine(lm, [[5, 6, 7]], 2, 16, stability_threshold=3, **knobs)
    never = run_engine(lm, [[5, 6, 7]], 2, 16, adaptive_stop=False, **knobs)
    assert huge[0].token_ids == equal[0].token_ids == never[0].token_ids
    assert set(huge[0].steps_per_block) == {3}


def test_its_own_setting_given_flat_is_refused_saying_how_to_give_it():
    with pytest.raises(InputError, match=r"'warmup' does not apply .*; give it as dgcai.warmup\)"):
        build_settings(CAI, warmup=0.2)
