"""Every command takes unset settings as `generate` does (decode/presets.py, config_for_model): a
block-diffusion model (tiny-bd, block lengths 4, 8, 16, 32) runs `serve`, `bench`, `calibrate` and
the lm-eval adapter with no block-length flag, at its own block length; a bad setting is refused
before the model loads."""

import json

import httpx
import pytest

import caidllm
import caidllm.models
import caidllm.options
from caidllm.cli import build_parser, main
from caidllm.decode.presets import config_for_model
from caidllm.errors import InputError
from caidllm.serve.app import create_app
from caidllm.serve.launch import settings_from
from caidllm.serve.local import LocalServer


@pytest.fixture(scope="module")
def tiny_bd():
    return caidllm.load("tiny-bd", device="cpu", dtype="float32")


@pytest.fixture
def no_loading(monkeypatch):
    """Loading the model fails the test: the refusal must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the setting was refused")

    monkeypatch.setattr(caidllm.models, "load", refuse)
    monkeypatch.setattr(caidllm.options, "load_model", refuse)


def test_config_for_model_takes_the_presets_block_where_the_model_has_it(tiny_bd):
    own = lambda method, **kw: config_for_model(tiny_bd.config, None, method, **kw)[0]  # noqa: E731
    assert own("cai").block_length == 4  # cai's 64 is not one of tiny-bd's: its own first
    assert own("llada2").block_length == 32 and own("sdar").block_length == 4  # the presets' own apply
    assert own("cai", gen_length=12).gen_length == 12  # whole blocks of the model's own, not of 64
    assert own("cai", block_length=8, gen_length=16).block_length == 8
    with pytest.raises(InputError, match="block_length 64 is not one the llada model decodes with"):
        own("cai", block_length=64)


def test_generate_takes_a_gen_length_alone(capsys):
    assert main(["generate", "7 + 5 =", "--model", "tiny-bd", "--gen-length", "12", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["token_ids"]


def test_serve_runs_tiny_bd_with_no_block_length(tiny_bd):
    args = build_parser().parse_args(["serve", "--model", "tiny-bd", "--step-policy", "all"])
    settings = settings_from(args, tiny_bd)
    assert (settings.defaults.block_length, settings.defaults.gen_length, settings.step_policy) == (
        4,
        256,
        "all",
    )
    with LocalServer(create_app(tiny_bd, settings)) as server:
        body = {"messages": [{"role": "user", "content": "7 + 5 ="}], "max_tokens": 8}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        body["block_length"] = 64  # a request's own field still wins, and is checked
        refused = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "block_length"


def test_serve_applies_a_known_checkpoints_recommendation(random_checkpoint):
    folder = random_checkpoint("llada", config_overrides={"caidllm_checkpoint": "GSAI-ML/LLaDA-8B-Instruct"})
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    defaults = settings_from(build_parser().parse_args(["serve", "--model", str(folder)]), lm).defaults
    assert (defaults.gen_length, defaults.block_length) == (128, 32)  # the card's, as generate takes them
    given = build_parser().parse_args(
        ["serve", "--model", str(folder), "--gen-length", "64", "--block-length", "16"]
    )
    assert (settings_from(given, lm).defaults.gen_length, settings_from(given, lm).defaults.block_length) == (
        64,
        16,
    )


def test_serve_takes_a_known_block_diffusion_checkpoints_own_decoder(tmp_path):
    from block_checkpoints import write_block_checkpoint

    folder = write_block_checkpoint(
        tmp_path / "LLaDA2.0-mini",
        "llada2",
        config_overrides={"caidllm_checkpoint": "inclusionAI/LLaDA2.0-mini"},
    )
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    defaults = settings_from(build_parser().parse_args(["serve", "--model", str(folder)]), lm).defaults
    assert (defaults.method, defaults.gen_length, defaults.block_length) == ("llada2", 512, 32)  # as generate
    given = settings_from(build_parser().parse_args(["serve", "--model", str(folder), "--method", "cai"]), lm)
    assert given.defaults.method == "cai"


def test_serve_with_a_settings_file_keeps_its_method_on_a_known_block_diffusion_checkpoint(tmp_path):
    """As generate: a settings file given, the checkpoint's own decoder is not taken (the server would
    otherwise default to it and silently leave the file unused: it applies to its own method only)."""
    from block_checkpoints import write_block_checkpoint

    folder = write_block_checkpoint(
        tmp_path / "LLaDA2.0-mini",
        "llada2",
        config_overrides={"caidllm_checkpoint": "inclusionAI/LLaDA2.0-mini"},
    )
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"caidllm_settings": 1, "method": "cai", "cai": {"theta_end": 0.5}}))
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    args = build_parser().parse_args(["serve", "--model", str(folder), "--settings", str(path)])
    defaults = settings_from(args, lm).defaults
    assert defaults.method == defaults.settings.method == "cai"


def test_serve_refuses_fair_under_tp_before_the_ranks_start(capsys, no_loading, monkeypatch):
    import caidllm.parallel.launch

    def refuse(*args, **kwargs):
        raise AssertionError("the ranks were started before the setting was refused")

    monkeypatch.setattr(caidllm.parallel.launch, "parallel_model", refuse)
    assert main(["serve", "--model", "tiny", "--tp", "2", "--step-policy", "fair"]) == 2
    err = capsys.readouterr().err.strip()
    assert "tensor-parallel" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, words",
    [
        (["serve", "--model", "tiny-bd", "--block-length", "64"], "block_length 64 is not one"),
        (["serve", "--model", "tiny", "--method", "llada2"], "block-diffusion decoder"),
        (
            [
                "bench",
                "--model",
                "tiny-bd",
                "--task",
                "synthetic:boolean_expressions",
                "--block-length",
                "64",
            ],
            "block_length 64 is not one",
        ),
        (
            ["bench", "--model", "tiny", "--task", "synthetic:boolean_expressions", "--methods", "llada2"],
            "block-diffusion decoder",
        ),
        (
            [
                "calibrate",
                "--model",
                "tiny-bd",
                "--task",
                "synthetic:boolean_expressions",
                "--out",
                "/tmp/x.json",
                "--block-length",
                "64",
            ],
            "block_length 64 is not one",
        ),
    ],
)
def test_bad_settings_are_refused_before_the_model_loads(argv, words, capsys, no_loading):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_serve_refuses_an_unknown_step_policy(capsys, no_loading):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", "tiny", "--step-policy", "nope"])
    assert exit_.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_bench_runs_tiny_bd_with_no_block_length(tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            [
                "bench",
                "--model",
                "tiny-bd",
                "--task",
                "synthetic:boolean_expressions",
                "--methods",
                "vanilla,cai",
                "--limit",
                "2",
                "--gen-length",
                "12",
                "--no-progress",
                "--no-warmup",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "results.json").read_text())
    assert (report["settings"]["block_length"], report["settings"]["gen_length"]) == (4, 12)
    assert all(r["n"] == 2 and r["errors"] == 0 for r in report["results"])


def test_calibrate_runs_tiny_bd_with_no_block_length(tmp_path):
    out = tmp_path / "settings.json"
    assert (
        main(
            [
                "calibrate",
                "--model",
                "tiny-bd",
                "--task",
                "synthetic:boolean_expressions",
                "--out",
                str(out),
                "--limit",
                "2",
                "--budget",
                "2",
                "--gen-length",
                "12",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "block_length 4" in out.with_suffix(".md").read_text()


def test_lm_eval_adapter_runs_tiny_bd_with_no_block_length(monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from caidllm.evaluation.lm_eval_adapter import CaidllmLM

    adapter = CaidllmLM(pretrained="tiny-bd", gen_length=12, batch_size=2, device="cpu")
    assert (adapter.block_length, adapter.gen_length) == (4, 12)
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(q, {"until": []}), idx=i)
        for i, q in enumerate(["7 + 5 =", "True and False is"])
    ]
    assert all(isinstance(a, str) for a in adapter.generate_until(requests))
    monkeypatch.setattr(caidllm.models, "load", lambda *a, **k: pytest.fail("loaded before refusing"))
    with pytest.raises(InputError, match="block_length 64 is not one"):
        CaidllmLM(pretrained="tiny-bd", block_length=64, device="cpu")
