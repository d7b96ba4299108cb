"""One table of field rules for the CLI, the Python API and the server (issue 36, part 3): a
property-based test (Hypothesis) that every decoding field's type and range is checked on all three,
from a specification written here independently of decode/config.py's table, and that the table
has no gaps (every field has a rule, every setting a scope or none by design)."""

import contextlib
import io
import math
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import caidllm
from caidllm.cli import main as cli_main
from caidllm.decode.config import SHARED_FIELDS, SHARED_RULE
from caidllm.decode.methods import PRESETS, settings_classes
from caidllm.decode.presets import build_config
from caidllm.decode.setting_names import FLAT_NAMES, SETTINGS_CLASSES, owners_of
from caidllm.errors import InputError
from caidllm.serve.protocol import RequestError, ServerDefaults, parse
from helpers.serve import PROMPT

INF = math.inf
# field -> (a method that reads it, kind, low, high, low excluded): the OpenAI-API-like domain of each.
SPEC = {
    "gen_length": ("cai", "int", 1, INF, False),
    "block_length": ("cai", "int", 1, INF, False),
    "steps": ("cai", "int", 1, INF, False),
    "minimal_topk": ("llada2", "int", 1, INF, False),
    "threshold": ("fastdllm", "num", 0, 1, True),
    "editing_threshold": ("llada2.1", "num", 0, 1, False),
    "max_post_steps": ("llada2.1", "int", 0, INF, False),
    "num_to_transfer": ("llada2", "int", 1, INF, False),
    "factor": ("fastdllm", "num", 0, INF, True),
    "refresh_every": ("cai", "int", 0, INF, False),
    "es_alpha": ("es-dllm", "num", 0, 1, False),
    "temperature": ("cai", "num", 0, INF, False),
    "seed": ("cai", "int", -INF, INF, False),
    "early_stop": ("cai", "bool", 0, 0, False),
    "eb_gamma": ("eb", "num", 0, INF, False),
    "eb_proxy": ("eb", "choice", 0, 0, False),
    "sf_explore_steps": ("slowfast", "int", 1, INF, False),
    "sf_window": ("slowfast", "int", 1, INF, False),
    "sf_std": ("slowfast", "num", 0, INF, True),
    "sf_cycle_threshold": ("slowfast", "num", 0, 1, True),
    "sf_high": ("slowfast", "num", 0, 1, True),
    "sf_shortened": ("slowfast", "bool", 0, 0, False),
    "wino_draft": ("wino", "num", 0, 1, True),
    "wino_verify": ("wino", "num", 0, 1, True),
    "wino_max_steps": ("wino", "int", 1, INF, False),
    "elastic_gamma": ("elastic", "num", 0, 1, True),
    "elastic_window": ("elastic", "int", 1, INF, False),
    "elastic_layer": ("elastic", "int", 0, INF, False),
    "elastic_track": ("elastic", "int", 1, INF, False),
    "elastic_scope": ("elastic", "choice", 0, 0, False),
    "sub_block": ("fastdllm-v2", "int", 1, INF, False),
    "dkv_window": ("dkv-greedy", "int", 0, INF, False),
    "cache": ("cai", "choice", 0, 0, False),
    "policy": ("cai", "choice", 0, 0, False),
    **{
        name: ("cai", "num", 0, 1, True)
        for name in (
            "theta_start",
            "theta_end",
            "block_end_floor",
            "fallback_threshold",
            "clip_low",
            "clip_high",
            "easy_confidence",
            "hard_confidence",
        )
    },
    "warmup": ("cai", "num", 0, 1, False),
    "block_end_decay": ("cai", "num", 0, INF, False),
    "grinding_yield": ("cai", "num", 0, INF, False),
    "grinding_patience": ("cai", "int", 1, INF, False),
    "adaptive": ("cai", "bool", 0, 0, False),
    "block_schedule": ("cai", "bool", 0, 0, False),
    "position_factors": ("cai", "bool", 0, 0, False),
    "gating": ("cai", "bool", 0, 0, False),
    "grinding_action": ("cai", "choice", 0, 0, False),
    "factors": ("cai", "numbers", 0, 0, False),
    "budget_fractions": ("cai", "numbers", 0, 0, False),
}
# Checked by its own normaliser (models/skip.py).
NOT_IN_SPEC = {"es_schedule"}
CLI_FLAGS = {
    "gen_length",
    "block_length",
    "steps",
    "threshold",
    "editing_threshold",
    "max_post_steps",
    "minimal_topk",
    "temperature",
    "seed",
}
# Settings every decoder reads (no scope), by design.
# the last two: model-level (block_diffusion.py)
READ_BY_EVERY_DECODER = {
    "gen_length",
    "block_length",
    "steps",
    "cache",
    "policy",
    "temperature",
    "seed",
    "early_stop",
    "editing_threshold",
    "max_post_steps",
}


def test_the_table_has_no_gaps():
    """Every flat name the methods declare (and every shared field) is in the spec, every field of every
    settings class has a rule, and the method the test uses for a name reads it."""
    assert set(SHARED_FIELDS) | set(FLAT_NAMES) - NOT_IN_SPEC == set(SPEC) | {"es_schedule"} - NOT_IN_SPEC
    # these two by their registries' choices
    assert set(SHARED_FIELDS) - set(SHARED_RULE) == {
        "cache",
        "policy",
    }
    for cls in SETTINGS_CLASSES:
        assert {f.name for f in fields(cls)} == {rule.field for rule in cls.RULES}, cls
    assert set(SHARED_FIELDS) - {"refresh_every"} == READ_BY_EVERY_DECODER
    for name, (method, *_) in SPEC.items():  # the method the test uses reads the field
        owners = owners_of(name)
        assert not owners or set(owners) & set(
            settings_classes(PRESETS[method]["policy"], PRESETS[method]["cache"])
        ), name


def _outside(low, high, low_open):
    return lambda x: not ((low < x if low_open else low <= x) and x <= high)


def bad_values(kind, low, high, low_open):
    junk = st.one_of(
        st.text(max_size=5),
        st.lists(st.integers(0, 3), max_size=2),
        st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    )
    if kind == "int":
        return st.one_of(
            junk,
            st.booleans(),
            st.floats(allow_nan=True),
            st.integers(max_value=int(low) - 1) if low > -INF else st.nothing(),
        )
    if kind == "num":
        return st.one_of(
            junk,
            st.booleans(),
            st.sampled_from([math.nan, INF, -INF]),
            st.floats(allow_nan=False).filter(_outside(low, high, low_open)),
            st.integers().filter(_outside(low, high, low_open)),
        )
    if kind == "bool":
        return st.one_of(
            junk, st.integers(), st.floats(allow_nan=False), st.sampled_from(["true", "no", 1, 0])
        )
    if kind == "numbers":
        return st.one_of(
            st.text(max_size=3),
            st.booleans(),
            st.lists(st.booleans(), min_size=1, max_size=4),
            st.lists(st.floats(-2, 0), min_size=3, max_size=4),
        )
    return st.one_of(st.integers(), st.booleans(), st.text(max_size=6).filter(lambda t: t not in _CHOICES))


_CHOICES = {
    "entropy",
    "confidence",
    "margin",
    "continue",
    "exit",
    "none",
    "prefix",
    "dual",
    "es",
    "dkv",
    "dkv-greedy",
    "elastic",
    "block",
    *PRESETS,
    "threshold",
    "vanilla",
    "random",
    "eb",
    "slowfast",
    "wino",
    "dynamic",
    "static",
    "cai",
}


@st.composite
def bad_settings(draw):
    name = draw(st.sampled_from(sorted(SPEC)))
    method, kind, low, high, low_open = SPEC[name]
    return name, method, draw(bad_values(kind, low, high, low_open))


def _cli(argv) -> int:
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = cli_main(argv)
        except SystemExit as exit_:
            code = exit_.code
    assert len(err.getvalue().strip().splitlines()) >= 1
    return code


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=bad_settings())
def test_every_field_is_checked_on_api_server_and_cli(tiny, case):
    name, method, value = case
    # Python API
    with pytest.raises(InputError, match=name):
        build_config(method, **{name: value})
    # Server (the request parser every endpoint uses)
    defaults = ServerDefaults(model_name="tiny", gen_length=64, block_length=16, max_gen_length=256)
    with pytest.raises(RequestError) as refused:
        parse({"prompt": PROMPT, "method": method, name: value}, "completion", tiny, defaults)
    assert refused.value.status == 400 and refused.value.param == name, refused.value.message
    # CLI (the flags it has): refused before the model loads, exit status 2
    if name in CLI_FLAGS and not isinstance(value, (list, dict)):
        assert _cli(["generate", "x", "--method", method, f"--{name.replace('_', '-')}", str(value)]) == 2


@pytest.mark.parametrize(
    "name, method, value",
    [
        ("threshold", "fastdllm", 0.5),
        ("wino_draft", "wino", 0.5),
        ("gating", "cai", False),
        ("elastic_layer", "elastic", 1),
        ("eb_gamma", "eb", 0.1),
        ("refresh_every", "cai", 2),
    ],
)
def test_a_good_value_passes_on_all_three(tiny, name, method, value):
    build_config(method, strict=True, **{name: value})
    defaults = ServerDefaults(model_name="tiny", gen_length=64, block_length=16, max_gen_length=256)
    parse({"prompt": PROMPT, "method": method, name: value}, "completion", tiny, defaults)


@pytest.mark.parametrize(
    "method, name, value, advice, advised",
    [
        # CAI reads `threshold` only with adaptive=false (top level or under cai); WINO's blocks end by
        # wino_max_steps.
        (
            "cai",
            "threshold",
            0.5,
            "adaptive=false",
            [{"threshold": 0.5, "adaptive": False}, {"threshold": 0.5, "cai": {"adaptive": False}}],
        ),
        ("wino", "steps", 16, "wino_max_steps", [{"wino_max_steps": 16}]),
    ],
)
def test_a_setting_its_policy_does_not_read_in_this_mode_is_refused_and_the_advice_works(
    tiny, method, name, value, advice, advised
):
    """Both were accepted and ignored."""
    defaults = ServerDefaults(model_name="tiny", gen_length=64, block_length=16, max_gen_length=256)
    with pytest.raises(RequestError) as refused:
        parse({"prompt": PROMPT, "method": method, name: value}, "completion", tiny, defaults)
    assert refused.value.param == name and advice in refused.value.message
    assert _cli(["generate", "x", "--method", method, f"--{name}", str(value)]) == 2
    for fix in advised:
        req = parse({"prompt": PROMPT, "method": method, **fix}, "completion", tiny, defaults)
        first = next(iter(fix))  # the setting kept: honoured (its policy's, by its field's name)
        own = req.config.policy_settings
        assert getattr(own, own.LEGACY[first]) == fix[first]
    build_config(method, **{name: value})  # the Python API's default stays lenient


def test_a_cai_threshold_is_taken_with_adaptive_off_from_a_settings_file_and_with_fastdllm():
    build_config("cai", strict=True, threshold=0.5, adaptive=False)
    build_config(
        "cai", strict=True, threshold=0.5, settings={"caidllm_settings": 1, "cai": {"adaptive": False}}
    )
    build_config("fastdllm", strict=True, threshold=0.5)
    build_config("vanilla", strict=True, steps=16)


@pytest.mark.parametrize(
    "model, body, refusal",
    [
        (
            "tiny",
            {"method": "fastdllm", "num_to_transfer": 1},
            "num_to_transfer (LLaDA2.1's quota per step) does not apply to the llada model",
        ),
        ("tiny", {"minimal_topk": 2}, "minimal_topk (LLaDA2's step cap) does not apply to the llada model"),
        (
            "tiny-bd",
            {"method": "vanilla", "refresh_every": 2},
            "refresh_every does not apply to a block-causal model",
        ),
    ],
)
def test_a_setting_the_model_never_reads_is_refused_as_such_not_with_a_method_it_refuses(
    tiny, model, body, refusal
):
    """Before: "read only by ... (methods: llada2, sdar)" on a full-sequence model, or "(methods: fastdllm,
    ...)" for refresh_every on a block-causal one: advice the model then refused in turn."""
    lm = tiny if model == "tiny" else caidllm.load("tiny-bd", device="cpu", dtype="float32")
    defaults = ServerDefaults(
        model_name=model,
        gen_length=32,
        block_length=lm.config.block_lengths[0] if lm.config.block_lengths else 16,
        max_gen_length=256,
    )
    with pytest.raises(RequestError) as refused:
        parse({"prompt": PROMPT, **body}, "completion", lm, defaults)
    name = next(k for k in body if k != "method")
    assert refused.value.param == name and refused.value.message.startswith(refusal), refused.value.message


@pytest.mark.parametrize(
    "name, method, value",
    [
        ("threshold", "vanilla", 0.5),
        ("wino_draft", "cai", 0.5),
        ("gating", "fastdllm", False),
        ("elastic_gamma", "cai", 0.5),
        ("eb_gamma", "fastdllm", 0.1),
        ("refresh_every", "vanilla", 2),
        ("sf_high", "eb", 0.5),
        ("dkv_window", "dkv", 1),
        ("es_alpha", "cai", 0.3),
        ("factor", "cai", 1.0),
    ],
)
def test_a_setting_the_method_does_not_read_is_refused_on_server_and_cli(tiny, name, method, value):
    defaults = ServerDefaults(model_name="tiny", gen_length=64, block_length=16, max_gen_length=256)
    with pytest.raises(RequestError) as refused:
        parse({"prompt": PROMPT, "method": method, name: value}, "completion", tiny, defaults)
    assert refused.value.param == name and "does not apply to method" in refused.value.message
    with pytest.raises(InputError, match=f"{name} does not apply"):
        build_config(method, strict=True, **{name: value})
    build_config(method, **{name: value})  # the Python API's default: one set of keywords over many methods
    if name in CLI_FLAGS:
        assert _cli(["generate", "x", "--method", method, f"--{name}", str(value)]) == 2
