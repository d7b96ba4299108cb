"""S2D2 (decode/policies/s2d2.py, models/selfspec.py): parity with phymhan/S2D2 as shipped (re-stated in
s2d2_reference.py) on tiny random SDAR, LLaDA2 and block-causal LLaDA-layout weights, and on Fast-dLLM v2's
official forward; batch invariance; the settings it refuses. The paper's configurations (AR-like caching,
token editing): test_s2d2_paper.py."""

from pathlib import Path

import pytest

import caidllm
from caidllm.errors import InputError
from helpers.s2d2 import (
    ALWAYS,
    BANDIT,
    DEFAULTS,
    HYSTERESIS,
    NO_RESAMPLE,
    PLAIN,
    PROMPTS,
    RATIO,
    STATIC,
    answer,
    assert_batch_invariant,
    assert_parity,
    models,
)

BENCH_DATA = Path(__file__).parent / "data" / "bench"


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


@pytest.mark.parametrize(
    "switch",
    [
        dict(resample=False),
        dict(ratio_threshold=0.0),
        dict(always_check_high_confidence=True),
        dict(ratio_threshold=0.5, ratio_all_masks=True),
        dict(cache_ver=True),
        dict(cache_ver=True, draft_ver=True),
        dict(draft_ver=True),
    ],
)
def test_the_switches_change_the_tokens(block_family, bd_llada, switch):
    """Each switch changes some answer on these weights (so its parity case can fail)."""
    config = dict(method="s2d2", gen_length=16, block_length=4, threshold=0.6, early_stop=False)
    changed = False
    for kind, lm in models(block_family, bd_llada).items():
        if kind == "llada2" and (switch.get("cache_ver") or switch.get("draft_ver")):
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


def test_refused_without_the_block_cache(block_family):
    """The verify forward reads the earlier blocks' keys and values from the exact block cache."""
    with pytest.raises(InputError, match="cache='none'") as err:
        block_family("sdar").generate([[5, 6, 7]], method="s2d2", gen_length=8, block_length=4, cache="none")
    assert err.value.field == "cache"


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
        (dict(cache_ver=False, draft_ver="no"), "s2d2.draft_ver"),
        (dict(sub_block=2, cache_ver=True), "s2d2.cache_ver"),
    ],
)
def test_bad_settings_name_the_field(block_family, settings, field):
    lm = block_family("sdar")
    with pytest.raises(InputError) as err:
        lm.generate([[5, 6, 7]], method="s2d2", gen_length=8, block_length=4, s2d2=settings)
    # The field is the key the caller gave it under; the message names the setting.
    assert err.value.field == "s2d2" and field in str(err.value) and "\n" not in str(err.value)


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
