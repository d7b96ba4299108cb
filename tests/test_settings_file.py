"""Settings files (decode/settings_file.py): reading, bad files, and --settings / settings= in
build_config, generate(), caidllm generate, bench and serve."""

import json

import pytest

from caidllm.cli import main
from caidllm.decode import build_config
from caidllm.decode.settings_file import load_settings, write_settings
from caidllm.errors import InputError
from caidllm.serve.protocol import ServerDefaults, parse

PROMPT = [5, 6, 7, 8, 9, 10]
VALUES = {"theta_end": 0.5, "warmup": 0.0, "grinding_action": "exit", "budget_fractions": [0.25, 0.75, 1.0]}


def settings_file(tmp_path, **data):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"caidllm_settings": 1, "method": "cai", "cai": VALUES, **data}))
    return path


def test_round_trip_and_values_between_preset_and_keywords(tmp_path):
    path = settings_file(tmp_path)
    loaded = load_settings(path)
    assert loaded.values["cai"]["budget_fractions"] == (0.25, 0.75, 1.0) and loaded.name == "cai-calibrated"
    write_settings(tmp_path / "again.json", loaded)
    assert load_settings(tmp_path / "again.json").values == loaded.values
    config = build_config("cai", settings=path)
    assert (
        config.policy_settings.theta_end,
        config.policy_settings.warmup,
        config.policy_settings.grinding_action,
    ) == (0.5, 0.0, "exit")
    assert config.policy_settings.theta_start == 0.90  # untouched: the preset's
    # the caller's keyword wins
    assert build_config("cai", settings=path, theta_end=0.8).policy_settings.theta_end == 0.8
    # the preset's own value stays
    assert build_config("cai-gate-off", settings=str(path)).policy_settings.gating is False


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{oops", "line 1 is not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"cai": {}}', "is not a caidllm settings file"),
        ('{"caidllm_settings": 1, "cai": {}, "extra": 1}', "unknown key(s) 'extra'"),
        ('{"caidllm_settings": 1, "cai": {"theta_ending": 0.5}}', "unknown cai setting(s) 'theta_ending'"),
        ('{"caidllm_settings": 1, "cai": {"grinding_action": "stop"}}', "cai.grinding_action must be one of"),
        ('{"caidllm_settings": 1, "cai": {"theta_end": 3}}', r"cai.theta_end must be in (0, 1]"),
        ('{"caidllm_settings": 1, "cai": [1]}', "'cai' must be an object"),
        ('{"caidllm_settings": 1, "method": "nope", "cai": {}}', "unknown method 'nope'"),
    ],
)
def test_bad_settings_files(tmp_path, content, message):
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as error:
        load_settings(path)
    assert message in str(error.value) and str(path) in str(error.value)


@pytest.mark.parametrize(
    "key, owner",
    [
        ("eb_gamma", '{"eb": {"gamma": ...}}'),
        ("eb.gamma", '{"eb": {"gamma": ...}}'),
        ("es_alpha", '{"es": {"alpha": ...}}'),
    ],
)
def test_a_flat_setting_at_the_top_of_a_file_says_its_owner_in_one_line(tmp_path, key, owner):
    path = settings_file(tmp_path, **{key: 0.5})
    with pytest.raises(InputError) as error:
        load_settings(path)
    message = str(error.value)
    assert "\n" not in message and f"unknown key(s) {key!r}" in message
    assert f"{key!r} is a setting of " in message and f"under its owner's key, {owner}" in message


def test_another_methods_settings_in_a_file_name_their_readers_without_advising_the_same_method(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"caidllm_settings": 1, "method": "vanilla", "eb": {"gamma": 0.02}}))
    with pytest.raises(InputError) as error:
        load_settings(path)
    message = str(error.value)
    assert "read only by policy 'eb' (methods: eb, " in message and message.endswith("does not run them")
    with pytest.raises(InputError, match=r"method 'vanilla' does not run them \(use 'cai'\)$"):
        build_config("vanilla", settings=settings_file(tmp_path))


def test_settings_refused_for_a_method_without_the_cai_controller(tmp_path):
    with pytest.raises(InputError, match="method 'vanilla' does not run them"):
        build_config("vanilla", settings=settings_file(tmp_path))
    with pytest.raises(InputError, match="settings must be a settings file path"):
        build_config("cai", settings=3)


def test_generate_with_settings_equals_the_same_keywords(llada_lm, tmp_path):
    kw = dict(gen_length=16, block_length=8, early_stop=False, gating=True)
    a = llada_lm.generate([PROMPT], method="cai", settings=settings_file(tmp_path), **kw)[0]
    b = llada_lm.generate([PROMPT], method="cai", **{**VALUES, "budget_fractions": (0.25, 0.75, 1.0)}, **kw)[
        0
    ]
    c = llada_lm.generate([PROMPT], method="cai", **kw)[0]
    assert (a.token_ids, a.nfe) == (b.token_ids, b.nfe)
    assert a.nfe != c.nfe  # the file changed something


def test_cli_generate_settings(llada_dir, tmp_path, capsys):
    path = settings_file(tmp_path)
    args = [
        "generate",
        "hello",
        "--model",
        str(llada_dir),
        "--gen-length",
        "16",
        "--block-length",
        "8",
        "--json",
        "--no-early-stop",
    ]
    assert main([*args, "--settings", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "cai" and out["settings"]["cai"]["grinding_action"] == "exit"
    assert main([*args, "--settings", str(tmp_path / "missing.json")]) == 2
    assert "settings file" in capsys.readouterr().err
    assert main([*args, "--settings", str(path), "--method", "vanilla"]) == 2
    assert "does not run them" in capsys.readouterr().err


def test_bench_runs_the_file_as_its_own_row_and_refuses_its_held_out_samples(llada_dir, tmp_path, capsys):
    path = settings_file(tmp_path, name="mine")
    out = tmp_path / "bench"
    args = [
        "bench",
        "--model",
        str(llada_dir),
        "--task",
        "synthetic:boolean_expressions",
        "--limit",
        "2",
        "--gen-length",
        "16",
        "--block-length",
        "8",
        "--no-warmup",
        "--no-progress",
        "--methods",
        "vanilla,cai",
    ]
    assert main([*args, "--settings", str(path), "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in report["results"]] == ["vanilla", "cai", "mine"]
    assert report["settings"]["settings_file"]["cai"]["theta_end"] == 0.5
    own = report["settings"]["method_settings"]  # each row's settings, read from the methods' declarations
    assert (
        own["mine"]["cai"]["theta_end"] == 0.5
        and own["cai"]["cai"]["theta_end"] == 0.7
        and own["vanilla"] == {}
    )
    assert "row `mine` is `cai` with theta_end=0.5" in (out / "results.md").read_text()
    capsys.readouterr()
    held = settings_file(
        tmp_path,
        calibration={
            "held_out": {"synthetic:boolean_expressions": {"ids": ["synthetic:boolean_expressions/1"]}}
        },
    )
    assert main([*args, "--settings", str(held)]) == 2
    assert "was calibrated on 1 of the samples of synthetic:boolean_expressions" in capsys.readouterr().err
    named_as_preset = settings_file(tmp_path, name="fastdllm")
    assert main([*args, "--settings", str(named_as_preset)]) == 2
    assert "is a preset's" in capsys.readouterr().err


class _Tokenizer:
    def encode(self, text, add_special_tokens=False):
        return [5, 6, 7]


class _Config:
    family, block_causal, block_lengths, max_length = "llada", False, (), 1024


class _LM:
    tokenizer = _Tokenizer()
    config = _Config()


def test_server_defaults_take_the_file_for_its_method_only(tmp_path):
    defaults = ServerDefaults(
        model_name="m", gen_length=16, block_length=8, settings=load_settings(settings_file(tmp_path))
    )
    cai = parse({"prompt": "x"}, "completion", _LM(), defaults).config
    assert cai.policy_settings.theta_end == 0.5 and cai.policy_settings.grinding_action == "exit"
    own = parse({"prompt": "x", "theta_end": 0.8}, "completion", _LM(), defaults).config
    # the request's field wins, the file fills the rest
    assert own.policy_settings.theta_end == 0.8 and own.policy_settings.warmup == 0.0
    other = parse({"prompt": "x", "method": "cai-es"}, "completion", _LM(), defaults).config
    assert other.policy_settings.theta_end == 0.70  # another method keeps its preset
    assert (
        parse({"prompt": "x", "method": "vanilla"}, "completion", _LM(), defaults).config.policy == "vanilla"
    )


def test_serve_cli_reads_the_settings_file(tmp_path):
    import argparse

    from caidllm.serve.cli import register, settings_from

    sub = argparse.ArgumentParser().add_subparsers()
    register(sub, "serve")
    parser = sub.choices["serve"]
    args = parser.parse_args(["--settings", str(settings_file(tmp_path))])
    lm = _LM()
    assert settings_from(args, lm).defaults.settings.values["cai"]["theta_end"] == 0.5
    assert main(["serve", "--settings", str(tmp_path / "none.json")]) == 2
