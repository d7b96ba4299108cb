"""benchmarks/llama_cpp_side_by_side.py with a stand-in forward_timer (a Python script that answers
as benchmarks/llama_cpp/forward_timer.cpp does): the canvas both engines run, the timing rows and
the logits agreement against caidllm, on a tiny LLaDA-MoE checkpoint (tests/helpers/random_model.py)."""

import importlib.util
import json
import re
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import caidllm
from helpers.random_model import write_random_model

ROOT = Path(__file__).resolve().parent.parent
MOE = (
    "random:llada-moe-7b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=4"
    "&expert_intermediate_size=32&num_experts=8&num_experts_per_tok=2&vocab_size=512&max_position_embeddings=256"
)
# forward_timer's two answers: `time` prints "cpu_ms wall_ms checksum" per forward; `logits` writes
# float32 [positions, vocab] (here: LOGITS_FILE's array plus OFFSET) and prints "positions vocab".
STAND_IN = """#!{python}
import sys
import numpy as np
mode, gguf, positions, last = sys.argv[1:5]
if mode == "time":
    for r in range(int(last)):
        print(f"{{10.0 + r}} {{11.0 + r}} 0")
else:
    logits = np.load({logits!r}) + float(open(gguf).read())
    logits.astype(np.float32).tofile(last)
    print(*logits.shape)
"""


def _script():
    spec = importlib.util.spec_from_file_location(
        "llama_cpp_side_by_side", ROOT / "benchmarks" / "llama_cpp_side_by_side.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(the script, a tiny MoE checkpoint, a stand-in timer, two 'GGUF' files: offsets 0 and 0.5)."""
    tmp = tmp_path_factory.mktemp("side")
    script = _script()
    folder = write_random_model(tmp / "ckpt", MOE)
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    logits = lm.logits(script.timer_canvas(lm.config.vocab_size))[0].numpy()
    np.save(tmp / "logits.npy", logits)
    timer = tmp / "timer"
    timer.write_text(STAND_IN.format(python=sys.executable, logits=str(tmp / "logits.npy")))
    timer.chmod(timer.stat().st_mode | stat.S_IEXEC)
    (tmp / "same.gguf").write_text("0")
    (tmp / "shifted.gguf").write_text("0.5")
    return script, folder, timer, tmp


def test_the_canvas_is_the_timers():
    canvas = _script().timer_canvas(157184)
    assert canvas.shape == (1, 128)
    assert canvas[0, :3].tolist() == [3, 3 + 7919, 3 + 2 * 7919]
    assert canvas[0, 100].item() == 3 + 100 * 7919 % (157184 - 3)


def test_agreement_compares_every_engines_logits_with_the_first_setting(setup, tmp_path):
    script, folder, timer, tmp = setup
    out = tmp_path / "agree.json"
    assert (
        script.main(
            [
                "--agreement",
                "--checkpoint",
                str(folder),
                "--timer",
                str(timer),
                "--settings",
                "fp32,bf16",
                "--gguf",
                f"F32={tmp / 'same.gguf'},SHIFTED={tmp / 'shifted.gguf'}",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = {(r["engine"], r["setting"]): r for r in json.loads(out.read_text())["rows"]}
    assert (
        rows["caidllm", "fp32"]["same_top_token"] == 128 and rows["caidllm", "fp32"]["max_diff_over_std"] == 0
    )
    assert (
        rows["llama.cpp", "F32"]["same_top_token"] == 128
        and rows["llama.cpp", "F32"]["max_diff_over_std"] == 0
    )
    # every logit 0.5 higher: the same top tokens, a constant difference
    shifted = rows["llama.cpp", "SHIFTED"]
    assert shifted["same_top_token"] == 128
    assert shifted["max_diff_over_std"] == pytest.approx(shifted["rms_diff_over_std"], rel=1e-4)
    assert 0 < rows["caidllm", "bf16"]["rms_diff_over_std"] < 0.1
    assert {r["reference"] for r in rows.values()} == {"caidllm fp32"}


def test_timing_alternates_and_reports_medians(setup, tmp_path):
    script, folder, timer, tmp = setup
    out = tmp_path / "time.json"
    assert (
        script.main(
            [
                "--checkpoint",
                str(folder),
                "--timer",
                str(timer),
                "--settings",
                "fp32",
                "--rounds",
                "2",
                "--per-round",
                "3",
                "--gguf",
                f"F32={tmp / 'same.gguf'}",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["canvas"] == 128 and report["rounds"] == 2 and not report["agreement"]
    ours, theirs = report["rows"]
    assert ours["engine"] == "caidllm" and ours["forward_cpu_ms"] > 0 and ours["weights_mb"] > 0
    assert theirs == {"engine": "llama.cpp", "setting": "F32", "forward_cpu_ms": 11.0, "file_mb": 0.0}


def test_a_failing_timer_is_named(setup, tmp_path):
    script, folder, _, tmp = setup
    with pytest.raises(SystemExit, match="forward_timer logits failed on .*missing.gguf"):
        script.llama_logits("false", str(tmp / "missing.gguf"), tmp_path / "x.bin")
    assert torch.equal(script.timer_canvas(10)[0, :2], torch.tensor([3, 3 + 7919 % 7]))


def test_per_expert_is_the_before_of_the_packed_experts(setup):
    """quant_forward's "@per-expert": the same oneDNN-packed experts run one linear at a time."""
    script, folder, _, _ = setup
    from caidllm.models import quantize

    if quantize.torchao_version() is None or not quantize.QUANTIZATIONS["int8-dynamic"].packing("cpu"):
        pytest.skip("needs torchao and oneDNN")
    from caidllm.models.cpu_int8 import OnednnInt8Experts
    from caidllm.models.moe_experts import ExpertList

    script.quant_forward.MODEL = str(folder)
    after = script.quant_forward.load_setting("int8-dynamic", None)
    before = script.quant_forward.load_setting("int8-dynamic@per-expert", None)
    experts = [
        m.experts for m in after.model.modules() if isinstance(getattr(m, "experts", None), ExpertList)
    ]
    assert experts and all(type(e) is OnednnInt8Experts for e in experts)
    experts = [
        m.experts for m in before.model.modules() if isinstance(getattr(m, "experts", None), ExpertList)
    ]
    assert experts and all(type(e) is ExpertList for e in experts)
    ids = script.timer_canvas(after.config.vocab_size)
    assert torch.equal(after.logits(ids), before.logits(ids))


def test_quant_parts_times_each_projection_and_profiles_a_forward(setup, tmp_path):
    """benchmarks/quant_parts.py on the tiny checkpoint: every projection shape at every row count,
    each weight kind timed, and a profiled forward per setting."""
    _, folder, _, _ = setup
    from caidllm.models import quantize

    if quantize.torchao_version() is None:
        pytest.skip("needs torchao")
    spec = importlib.util.spec_from_file_location("quant_parts", ROOT / "benchmarks" / "quant_parts.py")
    parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parts)
    out = tmp_path / "parts.json"
    assert (
        parts.main(
            [
                "--checkpoint",
                str(folder),
                "--linears",
                "--rows",
                "4,16",
                "--profile",
                "bf16,int4",
                "--repeats",
                "1",
                "--top",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    shapes = {(r["out_features"], r["in_features"], r["rows"]) for r in report["linears"]}
    assert shapes == {(o, i, rows) for o, i in [(32, 64), (64, 32), (64, 64)] for rows in (4, 16)}
    assert all(ms >= 0 for r in report["linears"] for ms in r["cpu_ms"].values())
    assert all({"bf16 F.linear", "int4 F.linear"} <= set(r["cpu_ms"]) for r in report["linears"])
    assert [f["setting"] for f in report["forwards"]] == ["bf16", "int4"]
    assert all(f["forward_cpu_ms"] > 0 and len(f["top"]) == 3 for f in report["forwards"])


@pytest.mark.parametrize(
    "setting, problem",
    [
        (
            "int8-dynamic@torchaoo",
            "'int8-dynamic@torchaoo': unknown kernel 'torchaoo'; expected @torchao or @per-expert",
        ),
        ("int9", "'int9': unknown setting 'int9'; expected one of fp32, bf16"),
        ("int4@per-expert", "'int4@per-expert': @per-expert runs int8-dynamic's packed experts"),
    ],
)
def test_a_setting_that_names_nothing_is_refused_before_loading(setup, setting, problem):
    """quant_forward's settings: a misspelt kernel would otherwise time the packed model under the
    name asked for (and @per-expert on another scheme would time that scheme unchanged)."""
    script, folder, _, _ = setup
    script.quant_forward.MODEL = str(folder)
    with pytest.raises(SystemExit, match=re.escape(problem)):
        script.quant_forward.load_setting(setting, None)


@pytest.mark.parametrize(
    "config, expert",
    [
        ({"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32}, 32),  # LLaDA2, SDAR-MoE
        # LLaDA-MoE
        (
            {"hidden_size": 64, "dense_intermediate_size": 128, "expert_intermediate_size": 32},
            32,
        ),
        ({"d_model": 64, "mlp_hidden_size": 96}, 96),  # LLaDA (dense)
    ],
)
def test_quant_parts_times_the_experts_width_of_every_moe_family(tmp_path, config, expert):
    spec = importlib.util.spec_from_file_location("quant_parts", ROOT / "benchmarks" / "quant_parts.py")
    parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parts)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert parts.shapes_of(str(tmp_path)) == [(expert, 64), (64, expert), (64, 64)]


def test_a_gguf_of_another_vocabulary_is_named_not_broadcast(setup, tmp_path):
    """forward_timer's canvas is token i = 3 + 7919 i mod (its n_vocab - 3): a GGUF whose vocabulary
    is not config.json's vocab_size ran another canvas, so its logits are not comparable."""
    script, folder, _, tmp = setup
    timer = tmp_path / "timer"
    timer.write_text(
        f"#!{sys.executable}\nimport sys, numpy as np\n"
        "np.zeros((128, 500), np.float32).tofile(sys.argv[4]); print(128, 500)\n"
    )
    timer.chmod(timer.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(
        SystemExit, match=re.escape("OTHER: llama.cpp's logits are [128, 500], caidllm's [128, 512]")
    ):
        script.main(
            [
                "--agreement",
                "--checkpoint",
                str(folder),
                "--timer",
                str(timer),
                "--settings",
                "fp32",
                "--gguf",
                f"OTHER={tmp / 'same.gguf'}",
                "--out",
                str(tmp_path / "a.json"),
            ]
        )
