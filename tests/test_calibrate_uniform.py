"""caidllm calibrate on a uniform-state model (tiny-dg): diffusiongemma-cai's dgcai settings searched
against the official sampler diffusiongemma, every decode seeded (reproducible trials), the file written
under "dgcai" and read back by generate, bench and the server; methods and files of the other kind refused
naming the field."""

import json

import pytest

import caidllm
from caidllm.bench.calibrate_kinds import UNIFORM_SPACE
from caidllm.bench.calibrate_run import CalibrateOptions, run_calibrate
from caidllm.cli import main
from caidllm.decode.settings_file import load_settings
from caidllm.errors import InputError
from test_diffusion_gemma_serve import SMALL

TASK = "synthetic:boolean_expressions"
PROMPTS = ["not True or False is", "True and ( False or True ) is"]
VALUES = {"warmup": 0.3, "gating": False, "grinding_patience": 2}  # not the defaults: NFE moves


@pytest.fixture(scope="module")
def dg_lm():
    return caidllm.load("tiny-dg", device="cpu", dtype="float32")


def _file(tmp_path, filename="f.json", **content):
    path = tmp_path / filename
    path.write_text(json.dumps({"caidllm_settings": 1, **content}))
    return path


def _calibrate(lm, out, **extra):
    options = CalibrateOptions(
        **{"tasks": [TASK], "out": str(out), "model": "tiny-dg", "limit": 4, "budget": 3, **extra},
        progress=False,
    )
    return run_calibrate(options, lm=lm, log=lambda m: None)


def _numbers(run):
    return [(t.label, t.values, t.accuracy, t.nfe, t.per_task) for t in run["trials"]]


def test_a_tiny_dg_calibration_is_reproducible_and_keeps_the_floor(dg_lm, tmp_path):
    first = _calibrate(dg_lm, tmp_path / "a.json", method="diffusiongemma-cai")
    again = _calibrate(dg_lm, tmp_path / "b.json")  # the method is the kind's default
    assert _numbers(first) == _numbers(again) and len(first["trials"]) == 3  # exact: NFEs are counts
    assert (first["vanilla"].accuracy, first["vanilla"].nfe) == (
        again["vanilla"].accuracy,
        again["vanilla"].nfe,
    )
    assert first["vanilla"].label == "diffusiongemma" and first["trials"][0].label == "start"
    settings = load_settings(tmp_path / "a.json")
    assert settings.method == "diffusiongemma-cai" and settings.name == "dgcai-calibrated"
    assert list(settings.values) == ["dgcai"] and set(settings.values["dgcai"]) == set(UNIFORM_SPACE)
    calibration = settings.calibration
    assert calibration["baseline_method"] == "diffusiongemma"
    assert calibration["baseline"]["label"] == "diffusiongemma" and "vanilla" not in calibration
    assert calibration["block_length"] == 64 and calibration["gen_length"] == 64  # one canvas of tiny-dg
    # the floor rule: the baseline's accuracy minus one point; the cheapest trial that meets it is chosen
    floor, trials, chosen = calibration["accuracy_floor"], first["trials"], first["chosen"]
    assert floor == pytest.approx(first["vanilla"].accuracy - 0.01)
    feasible = [t for t in trials if t.accuracy >= floor - 1e-12]
    assert [t.feasible for t in trials] == [t in feasible for t in trials]
    # (min and max: the earliest of equals, as the search keeps the earlier on a tie)
    if feasible:
        assert chosen is min(feasible, key=lambda t: t.nfe) and chosen.accuracy >= floor
    else:
        assert chosen is max(trials, key=lambda t: t.accuracy)
    assert settings.values["dgcai"] == chosen.values and calibration["meets_floor"] == bool(feasible)
    table = (tmp_path / "a.md").read_text()
    assert "the official sampler diffusiongemma" in table and "| 0 | diffusiongemma |" in table


def test_a_trial_is_generate_with_the_run_seed_and_its_dgcai_values(dg_lm, tmp_path):
    """A decode of the search (the baseline's, a trial's) is generate with seed 0 and, for a trial, its
    values as dgcai keywords: its NFE is theirs, and values that move NFE move the trial's."""
    from caidllm.bench.calibrate_kinds import UNIFORM
    from caidllm.bench.calibrate_run import _encode, _evaluator, held_out_tasks
    from caidllm.decode.api import tokenize_prompts

    run = _calibrate(dg_lm, tmp_path / "s.json", budget=2)
    options = CalibrateOptions(
        tasks=[TASK], out="unused", model="tiny-dg", method="diffusiongemma-cai", limit=4, gen_length=64
    )
    tasks = held_out_tasks(options)
    evaluate = _evaluator(dg_lm, options, tasks, {TASK: _encode(dg_lm, tasks[0], options)}, UNIFORM)
    ids = tokenize_prompts(dg_lm, [s.prompt for s in tasks[0].samples], bool(dg_lm.tokenizer.chat_template))

    def mean_nfe(method, **extra):
        results = dg_lm.generate(ids, method=method, seed=0, chat=False, **extra)
        return sum(r.nfe for r in results) / len(results)

    assert run["vanilla"].nfe == mean_nfe("diffusiongemma")
    assert run["trials"][1].nfe == mean_nfe("diffusiongemma-cai", dgcai=run["trials"][1].values)
    moved = evaluate("moved", VALUES)
    assert moved.nfe == mean_nfe("diffusiongemma-cai", dgcai=VALUES) != run["trials"][0].nfe


def test_generate_with_the_file_equals_the_same_dgcai_keywords(dg_lm, tmp_path):
    path = _file(tmp_path, method="diffusiongemma-cai", dgcai=VALUES)
    with_file = dg_lm.generate(PROMPTS, method="diffusiongemma-cai", settings=str(path), seed=1)
    same = dg_lm.generate(PROMPTS, method="diffusiongemma-cai", dgcai=VALUES, seed=1)
    plain = dg_lm.generate(PROMPTS, method="diffusiongemma-cai", seed=1)
    assert [r.token_ids for r in with_file] == [r.token_ids for r in same]
    assert [(r.token_ids, r.nfe) for r in with_file] != [(r.token_ids, r.nfe) for r in plain]
    # the caller's dgcai keys go over the file's (here: back to the defaults)
    back = dg_lm.generate(
        PROMPTS,
        method="diffusiongemma-cai",
        settings=load_settings(path),
        dgcai={"warmup": 0.15, "gating": True, "grinding_patience": 4},
        seed=1,
    )
    assert [r.token_ids for r in back] == [r.token_ids for r in plain]


def test_methods_and_files_of_the_other_kind_are_refused_naming_the_field(dg_lm, tmp_path):
    def refused(call, field, *words):
        with pytest.raises(InputError) as e:
            call()
        message = str(e.value)
        assert e.value.field == field and "\n" not in message and all(w in message for w in words), message

    fail = lambda m: pytest.fail(f"it ran: {m}")  # noqa: E731
    options = dict(tasks=[TASK], out=str(tmp_path / "s.json"), limit=1, budget=1, progress=False)
    refused(
        lambda: run_calibrate(CalibrateOptions(model="tiny-dg", method="cai", **options), log=fail),
        "method",
        "'cai'",
        "diffusiongemma-cai",
    )
    refused(
        lambda: run_calibrate(
            CalibrateOptions(model="tiny", method="diffusiongemma-cai", **options), log=fail
        ),
        "method",
        "'diffusiongemma-cai' is a uniform-state decoder",
    )
    cai_file = _file(tmp_path, "cai.json", method="cai", cai={"theta_end": 0.6})
    for method in ("diffusiongemma-cai", None):  # None: the file's own method is what generate is asked
        refused(
            lambda: dg_lm.generate(PROMPTS[:1], method=method, settings=str(cai_file)),
            "settings",
            "mask-based method 'cai'",
        )
    dg_file = _file(tmp_path, "dg.json", method="diffusiongemma-cai", dgcai=VALUES)
    refused(
        lambda: dg_lm.generate(PROMPTS[:1], method="diffusiongemma", settings=str(dg_file)),
        "settings",
        "no settings of its own",
    )
    refused(lambda: caidllm.load("tiny").generate(["x"], settings=str(dg_file)), "settings", "'dgcai'")


def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys):
    args = ["calibrate", "--model", "tiny-dg", "--task", TASK, "--out", str(tmp_path / "s.json")]
    assert main([*args, "--method", "cai"]) == 2
    err = capsys.readouterr().err.strip()
    assert "method 'cai'" in err and "diffusiongemma-cai" in err and len(err.splitlines()) == 1
    assert main([*args, "--block-length", "32"]) == 2
    assert "block_length does not apply" in capsys.readouterr().err
    cai_file = _file(tmp_path, "cai.json", method="cai", cai={"theta_end": 0.6})
    assert main(["generate", "--model", "tiny-dg", "--settings", str(cai_file), "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "settings" in err and "mask-based method 'cai'" in err and len(err.splitlines()) == 1
    dg_file = _file(tmp_path, "dg.json", method="diffusiongemma-cai", dgcai=VALUES)
    for command in ("generate", "serve"):  # on a mask-based model: the file is named, not its method
        assert (
            main([command, "--model", "tiny", "--settings", str(dg_file), *(["x"] * (command == "generate"))])
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert "settings file" in err and "uniform-state decoder 'diffusiongemma-cai'" in err, err


def test_bench_runs_the_file_as_a_row_and_refuses_its_held_out_samples(tmp_path):
    """The file's row decodes as a diffusiongemma-cai row given the same values by --set (the random
    model's entropies are high: bounds of 8 nats accept at once, far fewer forwards than the defaults)."""
    from caidllm.bench.runner import BenchConfig, run_bench

    loose = {"entropy_start": 8.0, "entropy_end": 8.0, "warmup": 0.0}
    path = _file(tmp_path, method="diffusiongemma-cai", name="mine", dgcai=loose)
    config = dict(model=SMALL, tasks=[TASK], limit=2, gen_length=16, progress=False, warmup=False)

    def rows(**extra):
        report = run_bench(BenchConfig(**config, **extra), log=lambda m: None)
        return report, {r["method"]: (r["nfe_mean"], r["accuracy"]) for r in report["results"]}

    report, with_file = rows(methods=["diffusiongemma-cai"], settings_file=str(path))
    assert list(with_file) == ["diffusiongemma-cai", "mine"]
    assert report["settings"]["method_settings"]["mine"]["dgcai"]["entropy_end"] == 8.0
    assert report["settings"]["settings_file"]["dgcai"] == loose
    _, with_set = rows(methods=["diffusiongemma-cai"], set_values={"dgcai": loose})
    assert with_file["mine"] == with_set["diffusiongemma-cai"] != with_file["diffusiongemma-cai"]
    held = _file(
        tmp_path,
        "held.json",
        method="diffusiongemma-cai",
        dgcai=VALUES,
        calibration={"held_out": {TASK: {"ids": [f"{TASK}/1"]}}},
    )
    with pytest.raises(InputError, match="was calibrated on 1 of the samples"):
        run_bench(
            BenchConfig(**config, methods=["diffusiongemma"], settings_file=str(held)), log=lambda m: None
        )


def test_the_server_takes_the_file_as_its_decoders_defaults(tmp_path):
    import argparse

    from caidllm.serve.cli import register, settings_from
    from caidllm.serve.protocol import parse

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub, "serve")
    path = _file(tmp_path, method="diffusiongemma-cai", dgcai=VALUES)
    lm = caidllm.load(SMALL, device="cpu", dtype="float32")

    def defaults(*flags):
        return settings_from(sub.choices["serve"].parse_args(["--settings", str(path), *flags]), lm).defaults

    served = defaults()  # no --method: the file's
    assert served.method == "diffusiongemma-cai"
    own = parse({"prompt": [5, 9, 3]}, "completion", lm, served).config.decoder_settings
    assert (own.warmup, own.gating, own.grinding_patience) == (0.3, False, 2)
    own = parse(
        {"prompt": [5, 9], "dgcai": {"warmup": 0.1}}, "completion", lm, served
    ).config.decoder_settings
    assert (own.warmup, own.gating) == (0.1, False)  # the request's field over the file's
    other = defaults("--method", "diffusiongemma")  # the file: the defaults of its method's requests only
    assert parse({"prompt": [5, 9]}, "completion", lm, other).config.decoder_settings is None
    asked = parse({"prompt": [5], "method": "diffusiongemma-cai"}, "completion", lm, other).config
    assert asked.decoder_settings.warmup == 0.3
    cai_file = _file(tmp_path, "cai.json", method="cai", cai={"theta_end": 0.6})
    with pytest.raises(InputError, match="mask-based method 'cai'") as e:
        settings_from(sub.choices["serve"].parse_args(["--settings", str(cai_file)]), lm)
    assert e.value.field == "settings"
