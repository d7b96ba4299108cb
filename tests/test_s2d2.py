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
ALWAYS = dict(router="mask_span_length", min_span=1)
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
    ],
)
def test_parity_with_the_official_loop(block_family, bd_llada, kind, router, acceptance, quota):
    lm = models(block_family, bd_llada)[kind]
    s = {**DEFAULTS, **router, "acceptance": acceptance}
    block, threshold = 4, 0.6
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


@pytest.mark.parametrize("acceptance, temperature", [("official", 0.0), ("greedy", 0.0), ("official", 0.8)])
def test_batch_invariance(block_family, acceptance, temperature):
    lm = block_family("llada2")
    config = build_config(
        "s2d2",
        gen_length=16,
        block_length=4,
        early_stop=False,
        temperature=temperature,
        seed=3,
        s2d2=dict(acceptance=acceptance),
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
        (dict(estimator="renyi"), "s2d2.estimator"),
        (dict(min_span=0), "s2d2.min_span"),
        (dict(router="score_hysteresis", hysteresis_on=-2.0, hysteresis_off=-1.0), "s2d2.hysteresis_on"),
        (dict(sub_block=3), "s2d2.sub_block"),
        (dict(acceptance="lossy"), "s2d2.acceptance"),
        (dict(tempering=0), "s2d2.tempering"),
    ],
)
def test_bad_settings_name_the_field(block_family, settings, field):
    lm = block_family("sdar")
    with pytest.raises(InputError) as err:
        lm.generate([[5, 6, 7]], method="s2d2", gen_length=8, block_length=4, s2d2=settings)
    # The field is the key the caller gave it under; the message names the setting.
    assert err.value.field == "s2d2" and field in str(err.value) and "\n" not in str(err.value)


def test_editing_is_refused(block_family):
    lm = block_family("llada2")
    with pytest.raises(InputError, match="editing_threshold") as err:
        lm.generate([[5, 6, 7]], method="s2d2-llada2", gen_length=8, block_length=8, editing_threshold=0.9)
    assert err.value.field == "editing_threshold"


@pytest.mark.parametrize("router", [ALWAYS, HYSTERESIS])
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
