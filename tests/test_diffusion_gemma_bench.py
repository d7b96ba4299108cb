"""DiffusionGemma (a small random config) through `caidllm bench`, lm-eval's generate_until and `caidllm
calibrate`: its decoders' rows (accuracy, forwards per canvas, tokens per forward, wall), a mask-based
method in the list refused by name before anything runs, loglikelihood refused saying why, calibrate's
method checked (its runs: test_calibrate_uniform.py)."""

import json
from pathlib import Path

import pytest

from caidllm.bench.runner import BenchConfig, run_bench
from caidllm.errors import InputError
from test_diffusion_gemma_serve import SMALL


def test_bench_runs_both_uniform_decoders():
    logged = []
    report = run_bench(
        BenchConfig(
            model=SMALL,
            tasks=["synthetic:boolean_expressions"],
            methods=["diffusiongemma", "greedy"],
            limit=2,
            gen_length=16,
            batch_size=2,
            progress=False,
            warmup=False,
        ),
        log=logged.append,
    )
    rows = report["results"]
    assert [r["method"] for r in rows] == ["diffusiongemma", "greedy"]
    for row in rows:
        assert row["n_generated"] == 2 and row["errors"] == 0 and row["accuracy"] is not None
        assert row["block_length"] == 16 and len(row["steps_per_block"]) == 1
        assert row["forwards_per_block"] == row["nfe_mean"] and row["wall_s"] > 0
        assert 0 < row["tokens_per_forward"] <= 16
        # where the time went: the forwards and the rule both measured (not the engine's overhead alone)
        assert 0 < row["forward_share"] < 1 and 0 < row["policy_share"] < 1
        assert row["forward_share"] + row["policy_share"] <= 1 + 1e-9
    assert report["settings"]["method_settings"]["greedy"]["greedy"]["seed"] == 0


@pytest.mark.parametrize(
    "model,methods,words",
    [
        (SMALL, ["diffusiongemma", "cai"], "the mask-based decoder 'cai' does not apply"),
        ("tiny", ["cai", "greedy"], "'greedy' is a uniform-state decoder"),
    ],
)
def test_a_method_of_the_other_kind_is_refused_before_the_model_loads(model, methods, words):
    logged = []
    config = BenchConfig(model=model, tasks=["synthetic:boolean_expressions"], methods=methods, limit=1)
    with pytest.raises(InputError, match=words):
        run_bench(config, log=logged.append)
    assert not any("loading model" in line for line in logged)


def test_lm_eval_generates_on_the_family_and_refuses_likelihood_saying_why(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from caidllm.evaluation.lm_eval_adapter import CaidllmLM

    adapter = CaidllmLM(
        pretrained=SMALL,
        gen_length=16,
        max_denoising_steps=3,
        batch_size=2,
        stats_path=str(tmp_path / "s.json"),
    )
    assert (adapter.method, adapter.block_length) == ("diffusiongemma", 16)
    requests = [
        Instance("generate_until", {}, (f"prompt {i}", {"until": [], "temperature": 0.7}), i)
        for i in range(3)
    ]
    answers = adapter.generate_until(requests)
    want = adapter.lm.generate(
        [adapter._encode(f"prompt {i}") for i in range(3)],
        gen_length=16,
        max_denoising_steps=3,
        seed=0,
        chat=False,
    )
    assert answers == [w.text for w in want]
    with pytest.raises(NotImplementedError, match="uniform-state diffusion"):
        adapter.loglikelihood([Instance("loglikelihood", {}, ("a", " b"), 0)])
    with pytest.raises(InputError, match="temperature"):
        CaidllmLM(pretrained=SMALL, temperature=0.5)
    with pytest.raises(InputError, match="block_length"):
        CaidllmLM(pretrained=SMALL, block_length=16)


def test_calibrate_refuses_another_decoder_of_the_family_in_one_line(tmp_path):
    """calibrate searches diffusiongemma-cai's settings on this family (tests/test_calibrate_uniform.py):
    another of its decoders is refused naming --method, before the model loads."""
    from caidllm.bench.calibrate_run import CalibrateOptions, run_calibrate

    options = CalibrateOptions(
        tasks=["synthetic:boolean_expressions"], out=str(tmp_path / "s.json"), model=SMALL, method="greedy"
    )
    with pytest.raises(InputError, match="searches the settings of 'diffusiongemma-cai'") as refused:
        run_calibrate(options, log=lambda message: pytest.fail(f"it ran: {message}"))
    assert refused.value.field == "method" and "\n" not in str(refused.value)


def test_lm_eval_takes_the_cai_variant_and_its_settings_as_dotted_model_args(tmp_path):
    """method=diffusiongemma-cai with dgcai.FIELD model_args (as --set takes them): they reach the rule (an
    entropy bound above log V accepts every position: other tokens than the defaults'); a bad one is
    refused naming it."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from caidllm.evaluation.lm_eval_adapter import CaidllmLM

    loose = {"dgcai.entropy_start": 20.0, "dgcai.entropy_end": 20.0}
    adapter = CaidllmLM(
        pretrained=SMALL, method="diffusiongemma-cai", gen_length=16, max_denoising_steps=3, **loose
    )
    assert adapter.method == "diffusiongemma-cai"
    requests = [Instance("generate_until", {}, (f"prompt {i}", {"until": []}), i) for i in range(2)]
    answers = adapter.generate_until(requests)
    prompts = [adapter._encode(f"prompt {i}") for i in range(2)]
    knobs = dict(method="diffusiongemma-cai", gen_length=16, max_denoising_steps=3, seed=0, chat=False)
    want = adapter.lm.generate(prompts, dgcai=dict(entropy_start=20.0, entropy_end=20.0), **knobs)
    plain = adapter.lm.generate(prompts, **knobs)
    assert answers == [w.text for w in want] != [p.text for p in plain]
    with pytest.raises(InputError, match="dgcai.nope is not a setting of 'diffusiongemma-cai'"):
        CaidllmLM(pretrained=SMALL, method="diffusiongemma-cai", **{"dgcai.nope": 1})


def test_the_lm_eval_wrapper_says_a_bad_model_arg_in_one_line(capsys):
    pytest.importorskip("lm_eval")
    from caidllm.evaluation.__main__ import main

    bench = Path(__file__).parent / "data" / "bench"
    argv = ["--model", "caidllm", "--model_args", "pretrained=tiny,method=cai,threshold=7"]
    argv += ["--tasks", "caidllm_bbh_boolean_expressions", "--metadata", json.dumps({"data_dir": str(bench)})]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "caidllm-lm-eval: error: cai.threshold must be in (0, 1], got 7.0"


def _bench(methods, early_stop=True, **values):
    config = BenchConfig(
        model=SMALL,
        tasks=["synthetic:boolean_expressions"],
        methods=methods,
        limit=2,
        gen_length=16,
        batch_size=2,
        progress=False,
        warmup=False,
        early_stop=early_stop,
        set_values=values,
    )
    return run_bench(config, log=lambda message: None)


def test_bench_set_reaches_the_uniform_rows_and_no_early_stop_turns_the_stop_off():
    """--set's shared knob reaches every uniform row, dgcai.* the CAI variant's only (in its row's settings);
    --no-early-stop runs every step (the stable-and-confident stop off), as generate --no-early-stop."""
    loose = {"entropy_start": 20.0, "entropy_end": 20.0}
    report = _bench(["diffusiongemma", "diffusiongemma-cai"], False, max_denoising_steps=3, dgcai=loose)
    rows = {r["method"]: r for r in report["results"]}
    assert rows["diffusiongemma"]["nfe_mean"] == rows["diffusiongemma-cai"]["nfe_mean"] == 3
    cai = report["settings"]["method_settings"]["diffusiongemma-cai"]
    assert cai["dgcai"]["entropy_start"] == cai["dgcai"]["entropy_end"] == 20.0
    assert cai["diffusiongemma-cai"]["adaptive_stop"] is False
    plain = report["settings"]["method_settings"]["diffusiongemma"]
    assert "dgcai" not in plain and plain["diffusiongemma"]["max_denoising_steps"] == 3


@pytest.mark.parametrize(
    "methods,values,words",
    [
        (["diffusiongemma", "greedy"], {"dgcai": {"warmup": 0.2}}, "no row of this run reads 'dgcai'"),
        (["diffusiongemma-cai"], {"dgcai": {"warmup": 2}}, r"dgcai.warmup must be in \[0, 1\)"),
        (["greedy"], {"threshold": 0.9}, "setting 'threshold' does not apply"),
    ],
)
def test_bench_set_refusals_name_the_setting_before_the_model_loads(methods, values, words):
    with pytest.raises(InputError, match=words):
        _bench(methods, **values)


def test_bench_set_on_a_mask_method_is_refused_in_one_line(capsys):
    from caidllm.cli import main

    argv = ["bench", "--task", "synthetic:boolean_expressions", "--methods", "cai", "--set", "x=1"]
    assert main(argv) == 2
    assert "--set gives the uniform-state decoders' rows" in capsys.readouterr().err.strip().splitlines()[-1]


def test_bench_lengths_on_the_family_is_one_line_before_it_loads(capsys):
    from caidllm.cli import main

    argv = ["bench", "--model", SMALL, "--task", "synthetic:boolean_expressions", "--methods", "greedy"]
    assert main([*argv, "--lengths", "16,32", "--block-length", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("caidllm: error: --lengths does not run on model family 'diffusion_gemma' yet")
