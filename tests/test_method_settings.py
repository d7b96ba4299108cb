"""Methods own their settings (issue 45): each policy's and cache mode's settings class declares its
fields, rules and flat names of earlier versions; old keywords, bodies and settings files keep working,
the owner's key gives the same, and every refusal is raised by the owning method, naming the field
(InputError.field, the server's `param`, the CLI's exit status 2)."""

import contextlib
import io
import json
from dataclasses import fields

import pytest

from caidllm.cli import main as cli_main
from caidllm.decode.block_diffusion import fit_to_model
from caidllm.decode.config import SHARED_FIELDS, DecodeConfig
from caidllm.decode.policies import POLICIES
from caidllm.decode.presets import build_config
from caidllm.decode.setting_names import FLAT_NAMES, OWNERS, SETTINGS_CLASSES, settings_table
from caidllm.decode.settings_file import load_settings
from caidllm.errors import InputError
from caidllm.serve.protocol import RequestError, ServerDefaults, parse
from helpers.serve import PROMPT

DEFAULTS = ServerDefaults(model_name="tiny", gen_length=64, block_length=16, max_gen_length=256)
# (method, flat name of 0.1, value, owner key, field): the old keyword and the owner's key give one setting.
OLD_AND_NEW = [
    ("eb", "eb_gamma", 0.02, "eb", "gamma"),
    ("eb", "eb_proxy", "margin", "eb", "proxy"),
    ("slowfast", "sf_window", 3, "slowfast", "window"),
    ("slowfast", "sf_shortened", False, "slowfast", "shortened"),
    ("wino", "wino_draft", 0.5, "wino", "draft"),
    ("wino", "wino_max_steps", 64, "wino", "max_steps"),
    ("cai", "theta_end", 0.6, "cai", "theta_end"),
    ("fastdllm", "threshold", 0.8, "fastdllm", "threshold"),
    ("es-dllm", "es_alpha", 0.25, "es", "alpha"),
    ("elastic", "elastic_gamma", 0.8, "elastic", "gamma"),
    ("dkv-greedy", "dkv_window", 1, "dkv", "window"),
    ("fastdllm-v2", "sub_block", 4, "subblock", "sub_block"),
]


def _own(config, owner):
    return config.policy_settings if config.policy_settings.OWNER == owner else config.cache_settings


@pytest.mark.parametrize("method, flat, value, owner, name", OLD_AND_NEW)
def test_an_old_keyword_and_the_owners_key_give_the_same_setting(method, flat, value, owner, name):
    old = build_config(method, strict=True, **{flat: value})
    new = build_config(method, strict=True, **{owner: {name: value}})
    assert getattr(_own(old, owner), name) == value and _own(old, owner) == _own(new, owner)
    assert old.given == new.given == (f"{owner}.{name}",)


@pytest.mark.parametrize(
    "method, flat, value, owner, name", [c for c in OLD_AND_NEW if c[0] != "fastdllm-v2"]
)
def test_an_old_body_and_a_body_with_the_owners_key_both_work(tiny, method, flat, value, owner, name):
    old = parse({"prompt": PROMPT, "method": method, flat: value}, "completion", tiny, DEFAULTS).config
    new = parse(
        {"prompt": PROMPT, "method": method, owner: {name: value}}, "completion", tiny, DEFAULTS
    ).config
    assert getattr(_own(old, owner), name) == value and _own(old, owner) == _own(new, owner)


@pytest.mark.parametrize(
    "method, body, param, words",
    [
        ("wino", {"wino_draft": 0.95}, "wino_draft", "WINO thresholds out of order: wino_draft (0.95)"),
        (
            "wino",
            {"wino": {"draft": 0.95}},
            "wino",
            "WINO thresholds out of order: wino.draft (0.95) must not exceed",
        ),
        ("slowfast", {"sf_window": 40}, "sf_window", "sf_window (40) is longer than the block (16)"),
        (
            "elastic-block",
            {"elastic_window": 40},
            "elastic_window",
            "elastic_window (40) is longer than the block",
        ),
        ("eb", {"eb": {"gamma": -1}}, "eb", "eb.gamma must be a number >= 0"),
        ("eb", {"eb_gamma": -1}, "eb_gamma", "eb_gamma must be a number >= 0"),
        ("eb", {"eb": {"gama": 1}}, "eb", "unknown eb setting 'gama'"),
        ("eb", {"eb": 0.1}, "eb", "eb must be an object of EB-Sampler"),
        ("es-dllm", {"es_alpha": 2}, "es_alpha", "es_alpha must be in [0, 1]"),
        (
            "cai",
            {"eb": {"gamma": 0.1}},
            "eb",
            "eb does not apply to method 'cai' (policy 'cai', cache 'dual'): it is "
            "read only by policy 'eb' (methods: eb, eb-confidence, eb-margin, eb-dual)",
        ),
        (
            "dkv-greedy",
            {"policy": "vanilla"},
            "policy",
            "cache 'dkv-greedy' with policy 'vanilla' is not meaningful",
        ),
        ("wino", {"cache": "dual"}, "cache", "policy 'wino' with cache='dual' is not meaningful"),
        (
            "cai-elastic",
            {"cai": {"grinding_action": "exit"}},
            "cai",
            "cache 'elastic' with cai.grinding_action='exit'",
        ),
    ],
)
def test_a_refusal_is_the_owning_methods_and_names_its_field(tiny, method, body, param, words):
    with pytest.raises(RequestError) as refused:
        parse({"prompt": PROMPT, "method": method, **body}, "completion", tiny, DEFAULTS)
    assert refused.value.status == 400 and refused.value.param == param, refused.value.message
    assert refused.value.message.startswith(words) and "\n" not in refused.value.message
    with pytest.raises(InputError) as error:  # the Python API, strict as the server
        build_config(method, strict=True, gen_length=64, block_length=16, **body)
    assert error.value.field == param and str(error.value) == refused.value.message


def _cli(argv) -> tuple[int, str]:
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = cli_main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


@pytest.mark.parametrize(
    "method, items, words",
    [
        ("eb", ["eb.gamma=-1"], "eb.gamma must be a number >= 0"),
        ("eb", ["eb_gamma=-1"], "eb_gamma must be a number >= 0"),
        ("slowfast", ["slowfast.shortened=yes"], "slowfast.shortened must be True or False, got 'yes'"),
        ("cai", ["wino.draft=0.5"], "wino does not apply to method 'cai'"),
        ("cai", ["bogus=1"], "unknown decoding option 'bogus'"),
        ("cai", ["theta_end"], "--set takes NAME=VALUE"),
    ],
)
def test_the_cli_sets_any_methods_setting_and_refuses_bad_ones_before_loading(method, items, words):
    code, err = _cli(["generate", "x", "--method", method, *(a for item in items for a in ("--set", item))])
    assert code == 2 and words in err, err


def test_a_settings_file_of_any_method_and_one_naming_another_methods_field(tmp_path):
    path = tmp_path / "eb.json"
    path.write_text(
        json.dumps({"caidllm_settings": 1, "method": "eb", "name": "eb-wide", "eb": {"gamma": 0.05}})
    )
    assert build_config("eb", settings=path).policy_settings.gamma == 0.05
    assert build_config("eb", settings=path, eb_gamma=0.1).policy_settings.gamma == 0.1  # the keyword wins
    assert load_settings(path).summary()["eb"] == {"gamma": 0.05}
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"caidllm_settings": 1, "method": "cai", "cai": {"gamma": 0.05}}))
    with pytest.raises(InputError) as error:
        load_settings(wrong)
    message = str(error.value)
    assert (
        "unknown cai setting(s) 'gamma'" in message
        and "is a setting of policy 'eb' or cache 'elastic'" in message
    )
    assert "\n" not in message
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"caidllm_settings": 1, "method": "cai", "eb": {"gamma": 0.05}}))
    with pytest.raises(InputError, match="hold 'eb' settings, read only by policy 'eb' .methods: eb, "):
        load_settings(other)


def test_the_declarations_are_the_only_list():
    """DecodeConfig holds no method's field; every owner's fields have a rule; the names index and the
    `caidllm models` table are read from the registries' classes."""
    shared = {f.name for f in fields(DecodeConfig)}
    for cls in SETTINGS_CLASSES:
        assert not shared & set(cls.LEGACY) - set(SHARED_FIELDS) and cls.OWNER in OWNERS
    assert {entry["owner"] for entry in settings_table()} == set(OWNERS)
    assert {p.settings_type for p in POLICIES.values()} - {POLICIES["vanilla"].settings_type} <= set(
        SETTINGS_CLASSES
    )
    assert set(FLAT_NAMES) >= {
        "eb_gamma",
        "sf_window",
        "wino_draft",
        "es_alpha",
        "elastic_gamma",
        "dkv_window",
    }


def test_a_request_is_fitted_to_its_model_once(tiny):
    config = parse({"prompt": PROMPT, "method": "eb", "eb_gamma": 0.02}, "completion", tiny, DEFAULTS).config
    assert config.fitted_to is not None and fit_to_model(config, tiny.config) is config
    assert config.policy_spec is POLICIES["eb"]  # resolved once, read at every step


def test_a_policy_changed_in_place_gets_its_own_settings_at_validation():
    config = build_config("cai")
    config.policy = "eb"  # set in place, past the constructor
    config.validate()
    assert (
        type(config.policy_settings) is POLICIES["eb"].settings_type and config.policy_spec is POLICIES["eb"]
    )


@pytest.mark.parametrize(
    "value, message",
    [({"gama": 0.1}, "unknown eb setting 'gama'; known: gamma, proxy"), (0.1, "eb must be an object of ")],
)
def test_an_owner_object_is_checked_alike_whether_its_method_runs_or_not(value, message):
    """The chosen method's key and another method's (kept out, its value checked by its owner) share one
    check."""
    for method in ("eb", "vanilla"):
        with pytest.raises(InputError) as error:
            build_config(method, eb=value)
        assert str(error.value).startswith(message) and error.value.field == "eb"


def test_the_method_settings_pages_examples_run():
    """docs/method-settings.md's python blocks run as written; its settings file loads."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "method-settings.md").read_text()
    python = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    files = re.findall(r"^```json\n(.*?)^```", page, re.S | re.M)
    assert python and files
    for block in python:
        exec(compile(block, "docs/method-settings.md", "exec"), {"build_config": build_config})
    for block in files:
        assert load_settings(json.loads(block)).values
