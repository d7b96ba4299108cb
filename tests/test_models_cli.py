"""`caidllm models` (tables, --json, a model's memory) and the command line's answer to bad
model folders: one line naming the file or field, exit status 2."""

import json

import pytest

from caidllm.cli import main
from caidllm.models.checkpoints import KNOWN
from helpers.checkpoint_files import write_checkpoint


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_models_lists_every_family_and_known_checkpoint(capsys):
    status, out, _ = run(capsys, "models")
    assert status == 0
    for checkpoint in KNOWN:
        assert checkpoint.hub_id in out
    for family in ("llada", "dream", "llada_moe"):
        assert f"  {family} " in out
    assert "7.36B/1.40B" in out and "8.02B/7.50B" in out  # LLaDA-MoE: 1.4B active of 7B
    assert "cai-es" in out and "none, prefix, dual, es" in out


def test_models_json_has_the_sources_and_figures(capsys):
    status, out, _ = run(capsys, "models", "--json")
    data = json.loads(out)
    assert status == 0 and {f["family"] for f in data["families"]} >= {"llada", "dream", "llada_moe"}
    rows = {c["hub_id"]: c for c in data["checkpoints"]}
    moe = rows["inclusionAI/LLaDA-MoE-7B-A1B-Instruct"]
    assert moe["parameters_total"] == 7_356_880_896 and moe["architecture"] == "LLaDAMoEModelLM"
    assert moe["chat_by_default"] is True and rows["GSAI-ML/LLaDA-8B-Base"]["chat_by_default"] is False
    assert all(c["recommended"]["source"] for c in data["checkpoints"])


def test_models_memory_of_a_known_checkpoint_needs_no_download(capsys):
    status, out, _ = run(
        capsys,
        "models",
        "--model",
        "GSAI-ML/LLaDA-8B-Instruct",
        "--dtype",
        "bfloat16",
        "--length",
        "1024",
        "--json",
    )
    m = json.loads(out)
    assert status == 0 and m["weights_bytes"] == 8_015_581_184 * 2
    # K and V, 32 layers, 32 heads
    assert m["cache_bytes_per_request"]["dual"] == 2 * 32 * 32 * 128 * 1024 * 2
    assert m["cache_bytes_per_request"]["prefix"] == 2 * m["cache_bytes_per_request"]["dual"]
    assert "gen_length 128" in m["recommended"]


def test_models_memory_of_a_folder_reads_its_config(capsys, tmp_path):
    folder = write_checkpoint(tmp_path, "Dream-org/Dream-Coder-v0-Instruct-7B")
    status, out, _ = run(capsys, "models", "--model", str(folder), "--dtype", "float32", "--length", "64")
    assert status == 0 and "Dream-Coder-v0-Instruct-7B" in out and "weights in float32" in out
    assert "cache per request at 64 positions" in out and "recommended: gen_length 768" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "tiny", "--dtype", "int3"], "unknown dtype 'int3'"),
        (["--model", "tiny", "--length", "0"], "--length must be a positive number"),
        (["--model", "not a model"], "not a model folder, a hub id"),
    ],
)
def test_models_bad_input_exits_2(capsys, argv, message):
    status, _, err = run(capsys, "models", *argv)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1


# ---- bad model folders on the command line --------------------------------------------------


def _edit(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _break_shard(folder):
    (folder / "model-00002-of-00002.safetensors").unlink()
    return "shards listed in .*model.safetensors.index.json are missing .*: model-00002-of-00002.safetensors"


def _drop_mask_token(folder):
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<|mask|>"]
    tok["model"]["vocab"].pop("<|mask|>")
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    _edit(folder / "tokenizer_config.json", mask_token=None)
    return "config.json mask_token_id 2 is not a token of .*Dream-v0-Base-7B/tokenizer.json"


def _contradict_family(folder):
    _edit(folder / "config.json", model_type="llada")  # a Dream folder whose model_type says LLaDA
    return "architectures \\['DreamModel'\\] name the dream family but model_type 'llada' names llada"


def _unknown_architecture(folder):
    _edit(folder / "config.json", architectures=["MysteryLM"], model_type="mystery")
    return "unknown model architecture .*MysteryLM.*mystery.*supported families: llada .*dream .*llada_moe"


def _moe_setting_not_modelled(folder):
    _edit(folder / "config.json", norm_topk_prob=True)
    return "unsupported LLaDA-MoE setting norm_topk_prob=True"


@pytest.mark.parametrize(
    "hub_id, breaks",
    [
        ("Dream-org/Dream-v0-Instruct-7B", _break_shard),
        ("Dream-org/Dream-v0-Base-7B", _drop_mask_token),
        ("Dream-org/Dream-v0-Base-7B", _contradict_family),
        ("GSAI-ML/LLaDA-8B-Base", _unknown_architecture),
        ("inclusionAI/LLaDA-MoE-7B-A1B-Base", _moe_setting_not_modelled),
    ],
)
def test_bad_folder_is_one_line_and_exit_2(capsys, tmp_path, hub_id, breaks):
    import re

    folder = write_checkpoint(tmp_path, hub_id, sharded=True)
    message = breaks(folder)
    status, _, err = run(capsys, "generate", "hi", "--model", str(folder), "--device", "cpu")
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and re.search(message, lines[0]), lines


def test_generate_on_a_known_checkpoint_applies_and_names_its_recommendation(capsys, tmp_path):
    folder = write_checkpoint(tmp_path, "apple/DiffuCoder-7B-cpGRPO")
    status, out, err = run(
        capsys,
        "generate",
        "what is 2 + 3 ?",
        "--model",
        str(folder),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--gen-length",
        "32",
        "--json",
    )
    assert status == 0
    assert (
        "apple/DiffuCoder-7B-cpGRPO: recommended settings applied: block_length 32, temperature 0; "
        "confidence gating off, f 8; chat template by default (source: apple/DiffuCoder-7B-Instruct "
        "model card"
    ) in err
    result = json.loads(out)
    assert result["answer_length"] <= 32


def test_generate_on_a_base_model_decodes_raw_text_unless_told(capsys, tmp_path):
    folder = write_checkpoint(tmp_path, "inclusionAI/LLaDA-MoE-7B-A1B-Base")
    argv = ["generate", "what is 2 + 3 ?", "--model", str(folder), "--device", "cpu", "--gen-length", "32"]
    status, _, err = run(capsys, *argv)
    assert status == 0 and "base model: raw text by default" in err
    status, _, err = run(capsys, *argv, "--chat")
    assert status == 2 and "LLaDA-MoE-7B-A1B-Base has no chat template" in err and "--no-chat" in err


def test_models_lists_the_uniform_decoders_and_their_settings_and_no_controller_on_their_row(capsys):
    """DiffusionGemma's row names its decoder, steps and temperature, not the CAI controller's gating and
    refresh (its decoders have neither); the uniform-state decoders' shared knobs and diffusiongemma-cai's
    own settings (dgcai.*) are listed, in the tables and in --json."""
    status, out, _ = run(capsys, "models")
    (row,) = [line for line in out.splitlines() if "google/diffusiongemma-26B-A4B-it" in line]
    assert status == 0 and row.endswith("diffusiongemma, gen 256, block 256, steps 48, T 0.8")
    assert "Decoders (--method) of uniform-state models: diffusiongemma, greedy, diffusiongemma-cai" in out
    assert "max_denoising_steps (48)" in out and "entropy_bound (0.1)" in out
    assert any(line.split()[:3] == ["dgcai.warmup", "default", "0.15:"] for line in out.splitlines())
    _, out, _ = run(capsys, "models", "--json")
    uniform = json.loads(out)["uniform_settings"]
    assert uniform["decoders"] == ["diffusiongemma", "greedy", "diffusiongemma-cai"]
    (own,) = uniform["own"]
    assert own["owner"] == "dgcai" and own["read_by"] == "diffusiongemma-cai"
    assert {"name": "warmup", "default": 0.15, "expected": "in [0, 1)"} in own["fields"]
