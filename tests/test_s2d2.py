"""S2D2 (decode/policies/s2d2.py, models/selfspec.py): parity with phymhan/S2D2 as shipped (re-stated in
s2d2_reference.py) on tiny random SDAR, LLaDA2 and block-causal LLaDA-layout weights, and on Fast-dLLM v2's
official forward; batch invariance; the settings it refuses."""

from pathlib import Path

import pytest
import torch

import caidllm
from caidllm.decode.presets import build_config
from caidllm.errors import InputError
from helpers.decoding import alone_static_joined
from s2d2_reference import s2d2_generate

BENCH_DATA = Path(__file__).parent / "data" / "bench"
PROMPTS = [[40, 41, 42, 43, 44], [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60]]
# The official signature's defaults (AR-like caching off; the s2d2 preset turns it on, SDAR Config-A's).
PLAIN = dict(cache_ver=False, draft_ver=False)
ALWAYS = dict(router="mask_span_length", min_span=1, **PLAIN)
STATIC = dict(
    router="score_threshold",
    score_threshold=0.0,
    score="difference_static",
    penalty=1.0,
    estimator="soft_entropy_negexp",
)
HYSTERESIS = dict(
    router="score_hysteresis",
    hysteresis_on=1.0,
    hysteresis_off=-5.0,
    score="difference_dynamic",
    penalty=1.0,
    estimator="hard_margin_threshold",
)
NO_RESAMPLE = dict(ALWAYS, resample=False)
RATIO = dict(ALWAYS, ratio_threshold=0.3, always_check_high_confidence=True)
BANDIT = dict(
    router="contextual_bandit_ucb", ucb_beta=0.5, ucb_span_bins=2, ucb_progress_bins=2, ucb_entropy_bins=2
)
DEFAULTS = dict(
    min_span=1,
    score_threshold=-1.0,
    hysteresis_on=0.0,
    hysteresis_off=-1.0,
    score="difference_dynamic",
    penalty=2.0,
    estimator="hard_margin_threshold",
    margin_threshold=0.05,
    entropy_temperature=1.0,
    acceptance="official",
    **PLAIN,
)


def answer(result):
    return (
        result.token_ids[: result.answer_length + 1]
        if result.answer_length < len(result.token_ids)
        else result.token_ids
    )


@pytest.fixture(scope="module")
def bd_llada(random_checkpoint):
    """A block-causal LLaDA-layout model (tiny-bd's layout), its head sharpened so confidences spread."""
    folder = random_checkpoint(
        "llada", config_overrides={"caidllm_block_causal": True, "caidllm_block_lengths": [4, 8]}, seed=5
    )
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    with torch.no_grad():
        lm.model.model.transformer.ff_out.weight.mul_(8)
    return lm


def models(block_family, bd_llada):
    return {"sdar": block_family("sdar"), "llada2": block_family("llada2"), "llada": bd_llada}


@pytest.mark.parametrize("kind", ["sdar", "llada2", "llada"])
@pytest.mark.parametrize(
    "router, acceptance, quota",
    [
        (ALWAYS, "official", None),
        (STATIC, "official", 1),
        (HYSTERESIS, "official", None),
        (ALWAYS, "greedy", 1),
        (NO_RESAMPLE, "official", None),
        (RATIO, "official", None),
        (dict(NO_RESAMPLE, ratio_threshold=0.0), "greedy", 1),
        (BANDIT, "official", None),
        (dict(BANDIT, ucb_entropy_source="masked", ucb_progress_bins=3), "greedy", 1),
    ],
)
def test_parity_with_the_official_loop(block_family, bd_llada, kind, router, acceptance, quota):
    s = {**DEFAULTS, **router, "acceptance": acceptance}
    assert_parity(models(block_family, bd_llada)[kind], s, quota, block=4)


AR_LIKE = dict(cache_ver=True, draft_ver=True)


@pytest.mark.parametrize("kind", ["sdar", "llada"])
@pytest.mark.parametrize(
    "router, acceptance, block",
    [
        (dict(ALWAYS, **AR_LIKE), "official", 4),
        (dict(ALWAYS, cache_ver=True), "official", 4),
        (dict(STATIC, **AR_LIKE), "official", 4),
        (dict(STATIC, **AR_LIKE), "greedy", 8),
        (dict(RATIO, cache_ver=True), "official", 8),
        (dict(BANDIT, **AR_LIKE), "official", 4),
    ],
)
def test_ar_like_caching_parity(block_family, bd_llada, kind, router, acceptance, block):
    """SDAR's --cache_ver (earlier blocks' keys and values token-causal) and --draft_ver (the draft reads
    the block's decoded prefix token-causally) against the official loop, prompts ending inside a block
    (the random SDAR decodes blocks of 4 only). The prefix store holds the prompts' block-causal blocks
    first: a request with AR-like caching must not take them."""
    s = {**DEFAULTS, **router, "acceptance": acceptance}
    lm = models(block_family, bd_llada)[kind]
    lm.generate(PROMPTS, method="s2d2", gen_length=16, block_length=block if kind == "llada" else 4)
    assert_parity(models(block_family, bd_llada)[kind], s, None, block=block if kind == "llada" else 4)


@pytest.mark.parametrize("kind", ["llada2", "llada"])
def test_ratio_threshold_over_every_mask(block_family, bd_llada, kind):
    """ssd_threshold_all_spans: at block 8 the masks after a gap in the block reach the ratio threshold."""
    s = {
        **DEFAULTS,
        **ALWAYS,
        "ratio_threshold": 0.6,
        "ratio_all_masks": True,
        "always_check_high_confidence": True,
    }
    assert_parity(models(block_family, bd_llada)[kind], s, 3, block=8)


def assert_parity(lm, s: dict, quota, block: int) -> None:
    threshold = 0.6
    results = lm.generate(
        PROMPTS,
        method="s2d2",
        gen_length=16,
        block_length=block,
        threshold=threshold,
        s2d2={**s, "num_to_transfer": quota},
    )
    stop = set(lm.config.eos_ids)
    for prompt, result in zip(PROMPTS, results):
        expected = s2d2_generate(
            lm,
            prompt,
            gen_length=16,
            block_length=block,
            steps=block,
            threshold=threshold,
            s=s,
            num_to_transfer=quota,
            stop_ids=stop,
        )
        assert answer(result) == expected


@pytest.mark.parametrize(
    "switch",
    [
        dict(resample=False),
        dict(ratio_threshold=0.0),
        dict(always_check_high_confidence=True),
        dict(ratio_threshold=0.5, ratio_all_masks=True),
        dict(cache_ver=True),
        dict(cache_ver=True, draft_ver=True),
    ],
)
def test_the_switches_change_the_tokens(block_family, bd_llada, switch):
    """Each switch changes some answer on these weights (so its parity case can fail)."""
    config = dict(method="s2d2", gen_length=16, block_length=4, threshold=0.6, early_stop=False)
    changed = False
    for kind, lm in models(block_family, bd_llada).items():
        if kind == "llada2" and switch.get("cache_ver"):
            continue  # LLaDA2's loop has no AR-like caching (refused)
        base = lm.generate(PROMPTS, s2d2=ALWAYS, **config)
        other = lm.generate(PROMPTS, s2d2={**ALWAYS, **switch}, **config)
        changed |= [r.token_ids for r in base] != [r.token_ids for r in other]
    assert changed


def test_verify_forwards_are_counted(block_family):
    lm = block_family("sdar")
    (own,) = lm.generate(PROMPTS[:1], method="sdar", gen_length=16, block_length=4, early_stop=False)
    (spec,) = lm.generate(
        PROMPTS[:1], method="s2d2", gen_length=16, block_length=4, early_stop=False, s2d2=ALWAYS
    )
    # Always verifying: every step is a draft forward and a verify forward.
    assert spec.nfe == 2 * sum(spec.steps_per_block)
    assert own.nfe == sum(own.steps_per_block)
    # The verify forwards run from inside the policy count as forward time, not policy time as well.
    assert spec.policy_s + spec.forward_s <= spec.elapsed_s


@pytest.mark.parametrize(
    "acceptance, temperature, router",
    [
        ("official", 0.0, ALWAYS),
        ("greedy", 0.0, ALWAYS),
        ("official", 0.8, ALWAYS),
        ("official", 0.8, BANDIT),
    ],
)
def test_batch_invariance(block_family, acceptance, temperature, router):
    assert_batch_invariant(block_family("llada2"), dict(PLAIN, **router, acceptance=acceptance), temperature)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("ar_like", [dict(cache_ver=True), AR_LIKE])
def test_ar_like_caching_batch_invariance(block_family, ar_like, temperature):
    """A request's token-causal span and cache row are its own: alone, batched, or joining a running batch
    (and beside a request without AR-like caching) it decodes the same."""
    lm = block_family("sdar")
    assert_batch_invariant(lm, dict(ALWAYS, **ar_like), temperature)
    from caidllm.decode.engine import Engine
    from helpers.decoding import _finished

    configs = [
        build_config(
            "s2d2", gen_length=16, block_length=4, early_stop=False, temperature=temperature, seed=3, s2d2=s
        )
        for s in (dict(ALWAYS, **ar_like), ALWAYS)
    ]
    alone = {}
    for c, config in enumerate(configs):
        for p, prompt in enumerate(PROMPTS):
            engine = Engine(lm, max_batch=1)
            rid = engine.submit(prompt, config)
            alone[c, p] = _finished(engine)[rid].token_ids
    assert alone[0, 0] != alone[1, 0] or alone[0, 1] != alone[1, 1]  # the setting changes some answer
    engine = Engine(lm, max_batch=4)
    ids = {
        (c, p): engine.submit(prompt, config)
        for c, config in enumerate(configs)
        for p, prompt in enumerate(PROMPTS)
    }
    mixed = _finished(engine)
    assert {key: mixed[rid].token_ids for key, rid in ids.items()} == alone


def assert_batch_invariant(lm, s2d2: dict, temperature: float) -> None:
    config = build_config(
        "s2d2",
        gen_length=16,
        block_length=4,
        early_stop=False,
        temperature=temperature,
        seed=3,
        s2d2=s2d2,
    )
    alone, static, joined = alone_static_joined(lm, config, PROMPTS + [[61, 62, 63]])
    assert alone == static == joined


def test_refused_on_a_full_sequence_model(llada_lm):
    with pytest.raises(InputError, match="s2d2.*block-diffusion decoder.*full-sequence") as err:
        llada_lm.generate([[5, 6, 7]], method="s2d2", gen_length=8)
    assert err.value.field == "method"


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(router="ucb"), "s2d2.router"),
        (dict(ucb_span_bins=0), "s2d2.ucb_span_bins"),
        (dict(ucb_entropy_source="all"), "s2d2.ucb_entropy_source"),
        (dict(sub_block=2, router="contextual_bandit_ucb"), "s2d2.router"),
        (dict(estimator="renyi"), "s2d2.estimator"),
        (dict(min_span=0), "s2d2.min_span"),
        (dict(router="score_hysteresis", hysteresis_on=-2.0, hysteresis_off=-1.0), "s2d2.hysteresis_on"),
        (dict(sub_block=3), "s2d2.sub_block"),
        (dict(acceptance="lossy"), "s2d2.acceptance"),
        (dict(tempering=0), "s2d2.tempering"),
        (dict(resample="no"), "s2d2.resample"),
        (dict(ratio_threshold="high"), "s2d2.ratio_threshold"),
        (dict(sub_block=2, always_check_high_confidence=True), "s2d2.always_check_high_confidence"),
        (dict(sub_block=2, ratio_threshold=0.5), "s2d2.ratio_threshold"),
        (dict(cache_ver="yes"), "s2d2.cache_ver"),
        (dict(cache_ver=False, draft_ver=True), "s2d2.draft_ver"),
        (dict(sub_block=2, cache_ver=True), "s2d2.cache_ver"),
    ],
)
def test_bad_settings_name_the_field(block_family, settings, field):
    lm = block_family("sdar")
    with pytest.raises(InputError) as err:
        lm.generate([[5, 6, 7]], method="s2d2", gen_length=8, block_length=4, s2d2=settings)
    # The field is the key the caller gave it under; the message names the setting.
    assert err.value.field == "s2d2" and field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kind, options",
    [("llada2", {}), ("fastdllm_v2", {}), ("sdar", {"cache": "subblock"})],
)
def test_ar_like_caching_refused_where_the_loop_has_none(block_family, kind, options):
    """LLaDA2's loop has no AR-like caching, Fast-dLLM v2's is not re-stated; it needs the exact cache."""
    lm = block_family(kind)
    with pytest.raises(InputError, match="s2d2.cache_ver") as err:
        lm.generate(
            [[5, 6, 7]], method="s2d2", gen_length=8, block_length=4, s2d2=dict(cache_ver=True), **options
        )
    assert err.value.field == "s2d2" and "\n" not in str(err.value)


# The hysteresis switch on for good once on (off at -100), unless an editing step with no mask left turns it off
# as LLaDA2's loop does: a case that fails when that step skips the router.
STICKY = dict(
    router="score_hysteresis",
    hysteresis_on=1.5,
    hysteresis_off=-100.0,
    score="difference_static",
    penalty=0.0,
    margin_threshold=0.02,
)


@pytest.mark.parametrize(
    "kind, router, acceptance, editing, post, block",
    [
        ("llada2", ALWAYS, "official", 0.0, 16, 4),
        ("llada2", dict(HYSTERESIS, **PLAIN), "official", 0.0, 2, 4),
        ("llada2", dict(STICKY, **PLAIN), "official", 0.0, 1, 4),
        ("llada2", dict(HYSTERESIS, **PLAIN), "greedy", 0.1, 1, 8),
        ("llada2", dict(STATIC, **PLAIN), "official", 0.05, 0, 8),
        ("llada2", ALWAYS, "greedy", 0.1, 3, 8),
        ("llada", dict(STATIC, **PLAIN), "official", 0.5, 2, 4),
    ],
)
def test_editing_parity(block_family, bd_llada, kind, router, acceptance, editing, post, block):
    """LLaDA2.1's token editing with S2D2 (LLaDA2/generate_utils.py generate_ssd_policy, re-stated in
    s2d2_llada2_reference.py): the edits made before verification and verified with the block, the router
    asked at editing steps with no mask left, the block's end by the editing rule."""
    from s2d2_llada2_reference import s2d2_llada2_generate

    lm = models(block_family, bd_llada)[kind]
    s = {**DEFAULTS, **router, "acceptance": acceptance}
    config = dict(gen_length=16, block_length=block, threshold=0.6, max_post_steps=post, s2d2=s)
    results = lm.generate(PROMPTS, method="s2d2-llada2", editing_threshold=editing, **config)
    for prompt, result in zip(PROMPTS, results):
        expected = s2d2_llada2_generate(
            lm,
            prompt,
            gen_length=16,
            block_length=block,
            threshold=0.6,
            editing_threshold=editing,
            max_post_steps=post,
            s=s,
            stop_ids=set(lm.config.eos_ids),
        )
        assert answer(result) == expected


def test_editing_changes_the_tokens(block_family):
    lm = block_family("llada2")
    config = dict(method="s2d2-llada2", gen_length=16, block_length=4, threshold=0.6, s2d2=ALWAYS)
    edited = lm.generate(PROMPTS, editing_threshold=0.0, max_post_steps=16, **config)
    plain = lm.generate(PROMPTS, editing_threshold=1.0, max_post_steps=16, **config)
    assert [r.token_ids for r in edited] != [r.token_ids for r in plain]
    assert all(e.nfe > p.nfe for e, p in zip(edited, plain))  # the editing steps' forwards


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_editing_batch_invariance(block_family, temperature):
    lm = block_family("llada2")
    config = build_config(
        "s2d2-llada2",
        gen_length=16,
        block_length=4,
        early_stop=False,
        temperature=temperature,
        seed=3,
        threshold=0.6,
        editing_threshold=0.0,
        max_post_steps=2,
        s2d2=dict(HYSTERESIS),
    )
    alone, static, joined = alone_static_joined(lm, config, PROMPTS + [[61, 62, 63]])
    assert alone == static == joined


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(ratio_threshold=0.3), "s2d2.ratio_threshold"),
        (dict(always_check_high_confidence=True), "s2d2.always_check_high_confidence"),
        (dict(resample=False), "s2d2.resample"),
        (dict(router="contextual_bandit_ucb"), "s2d2.router"),
        (dict(num_to_transfer=None), "s2d2.num_to_transfer"),
    ],
)
def test_editing_refuses_what_llada2s_loop_lacks(block_family, settings, field):
    """Token editing with S2D2 is LLaDA2's loop: SDAR's options are refused with it, naming the field."""
    lm = block_family("llada2")
    with pytest.raises(InputError) as err:
        lm.generate([[5, 6, 7]], method="s2d2-llada2", gen_length=8, block_length=8, s2d2=settings)
    assert err.value.field == "s2d2" and field in str(err.value) and "editing_threshold" in str(err.value)


def test_the_paper_presets():
    """SDAR Config-A with AR-like caching; LLaDA2.1-Mini Conservative and Quality with token editing."""
    from caidllm.decode.methods import PRESETS

    assert PRESETS["s2d2"]["s2d2"] | {"cache_ver": True, "draft_ver": True} == PRESETS["s2d2"]["s2d2"]
    conservative, quality = PRESETS["s2d2-llada2"], PRESETS["s2d2-llada2-quality"]
    assert (conservative["threshold"], conservative["editing_threshold"]) == (0.95, 0.9)
    assert (quality["threshold"], quality["editing_threshold"]) == (0.7, 0.5)
    assert conservative["s2d2"]["score_threshold"] == -5.0 and quality["s2d2"]["score_threshold"] == 0.0


@pytest.mark.parametrize("router", [ALWAYS, HYSTERESIS, NO_RESAMPLE])
@pytest.mark.parametrize("acceptance", ["official", "greedy"])
def test_fastdllm_v2_parity(tmp_path_factory, router, acceptance):
    """Fast-dLLM v2: the sub-block rule under the router, the verify forward causal with shifted logits."""
    from block_checkpoints import write_block_checkpoint
    from s2d2_reference import OfficialFastDLLMv2S2D2

    folder = write_block_checkpoint(
        tmp_path_factory.mktemp("fdv2"),
        "fastdllm_v2",
        seed=3,
        head_scale=6.0,
        config_overrides={"bd_size": 16},
    )
    lm, official = caidllm.load(folder, device="cpu", dtype="float32"), OfficialFastDLLMv2S2D2(folder)
    s = {**DEFAULTS, **router, "acceptance": acceptance}
    prompts = [[40, 41, 42, 43, 44], list(range(50, 70))]
    results = lm.generate(
        prompts,
        method="s2d2-fastdllm-v2",
        gen_length=32,
        block_length=16,
        threshold=0.9,
        s2d2={**s, "sub_block": 4},
    )
    stop = set(lm.config.eos_ids)
    for prompt, result in zip(prompts, results):
        expected = official.generate_s2d2(
            prompt, 32, threshold=0.9, small_block_size=4, block_size=16, stop_ids=stop, s=s
        )
        # the official runs max_new_tokens // block_size blocks from the prompt's block (fdv2_reference.py)
        ours, n = answer(result), min(len(answer(result)), len(expected))
        assert ours[:n] == expected[:n] and n >= 16
        if expected[-1] in stop:
            assert ours == expected


def test_served_and_benched(bd_llada, tmp_path):
    """A served s2d2 request answers as generate() does, its NFE counting the verify forwards; a bad setting
    is a 400 naming it; bench runs it beside the model's own decoder."""
    import json

    import httpx

    from caidllm.cli import main
    from caidllm.serve.app import ServerConfig, create_app
    from caidllm.serve.local import LocalServer
    from caidllm.serve.protocol import ServerDefaults
    from helpers.serve import assert_refused

    text = "two and two"
    (want,) = bd_llada.generate([text], method="s2d2", gen_length=16, block_length=4)
    defaults = ServerDefaults(
        model_name="bd", method="s2d2", gen_length=16, block_length=4, max_gen_length=64
    )
    with LocalServer(
        create_app(bd_llada, ServerConfig(defaults=defaults, max_batch=4, max_queue=8))
    ) as server:
        body = {"messages": [{"role": "user", "content": text}], "method": "s2d2"}
        got = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
        assert_refused(server.url, {"method": "s2d2", "s2d2": {"router": "ucb"}}, "s2d2", "s2d2.router")
    assert got["choices"][0]["message"]["content"] == want.text
    assert got["caidllm"]["nfe"] == want.nfe > sum(want.steps_per_block)
    out = tmp_path / "run"
    args = [
        "bench",
        "--model",
        str(bd_llada.path),
        "--task",
        "bbh:boolean_expressions",
        "--methods",
        "sdar,s2d2",
    ]
    args += ["--limit", "2", "--data-dir", str(BENCH_DATA), "--out", str(out), "--gen-length", "16"]
    assert main(args + ["--block-length", "4", "--batch-size", "2", "--no-progress"]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["method"] for r in rows] == ["sdar", "s2d2"] and all(r["errors"] == 0 for r in rows)
