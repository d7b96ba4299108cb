"""The public block-diffusion checkpoints by name (models/checkpoints.py): exact parameter counts
of their official shapes on the meta device, a tiny folder of each loads as that checkpoint and
decodes with its own decoder and recommended settings, and `caidllm models` lists the decoders and
cache modes the decode registries hold."""

import pytest

import caidllm
from block_checkpoints import write_block_checkpoint
from caidllm.cli import main
from caidllm.decode.block_diffusion import ModelTraits, applicable
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.models.checkpoints import KNOWN, recommended_method, recommended_options
from caidllm.models.inventory import shape_figures

BLOCK = [c for c in KNOWN if c.family in ("llada2", "sdar", "fastdllm_v2")]
# (total, active) on the meta device. Totals against the published figures: LLaDA2.0-mini "16B" / -flash
# "100B" (docs/block-diffusion-models.md), SDAR = its Qwen3 base with an untied head (1.7B, 4B, 8B, 30B-A3B),
# Fast-dLLM v2 = Qwen2.5-1.5B (tied) / 7B. Active: without the unused experts and the embedding lookup
# (inclusionAI's "1.4B active" for LLaDA2.0-mini counts the embedding: 1,432,968,192).
COUNTS = {
    "llada2-mini": (16_255_638_528, 1_111_055_360),
    "llada2.1-mini": (16_255_638_528, 1_111_055_360),
    "llada2-flash": (102_889_697_280, 5_508_444_160),
    "llada2.1-flash": (102_889_697_280, 5_508_444_160),
    "llada2.2-flash": (102_889_697_280, 5_508_444_160),  # block routing adds no parameter
    "sdar-1.7b": (2_031_739_904, 1_720_574_976),
    "sdar-4b": (4_411_424_256, 4_022_468_096),
    "sdar-8b": (8_190_735_360, 7_568_405_504),
    "sdar-30b-a3b": (30_532_122_624, 3_041_867_776),
    "fastdllm-v2-1.5b": (1_543_714_304, 1_543_714_304),
    "fastdllm-v2-7b": (7_615_616_512, 7_070_619_136),
}
KIND = {"llada2": "llada2", "sdar": "sdar", "fastdllm_v2": "fastdllm_v2"}


def test_every_block_checkpoint_is_known():
    names = {c.hub_id for c in BLOCK}
    assert names == {f"inclusionAI/LLaDA2.{v}-{s}" for v in "01" for s in ("mini", "flash")} | {
        f"JetLM/SDAR-{s}-Chat" for s in ("1.7B", "4B", "8B", "30B-A3B")
    } | {f"Efficient-Large-Model/Fast_dLLM_v2_{s}" for s in ("1.5B", "7B")} | {
        # The 2026 checkpoints on these architectures (models/checkpoints_derived.py).
        "inclusionAI/LLaDA2.2-flash",
        "inclusionAI/LLaDA2.0-mini-CAP",
        "inclusionAI/LLaDA2.0-flash-CAP",
        "Gen-Verse/TraDo-4B-Instruct",
        "Gen-Verse/TraDo-8B-Instruct",
        "Gen-Verse/TraDo-8B-Thinking",
        "d3LLM/SDAR-4B-Chat-distill-search",
        "d3LLM/SDAR-4B-Chat-distill-webshop",
    }
    assert {c.shape for c in BLOCK} == set(COUNTS)


@pytest.mark.parametrize("shape", sorted(COUNTS))
def test_parameter_counts_on_the_meta_device(shape):
    figures = shape_figures(shape)  # built once on the meta device (`caidllm models` reads the same)
    assert (figures["parameters_total"], figures["parameters_active"]) == COUNTS[shape]


def test_contexts():
    context = {c.hub_id: shape_figures(c.shape)["context"] for c in BLOCK}
    assert context["inclusionAI/LLaDA2.0-mini"] == 16384 and context["inclusionAI/LLaDA2.1-mini"] == 32768
    assert context["inclusionAI/LLaDA2.2-flash"] == 131072
    assert (
        context["JetLM/SDAR-8B-Chat"] == 32768 and context["Efficient-Large-Model/Fast_dLLM_v2_7B"] == 32768
    )


@pytest.mark.parametrize("checkpoint", BLOCK, ids=lambda c: c.name)
def test_a_folder_of_each_decodes_with_its_own_decoder(tmp_path, checkpoint):
    special = {"sdar-30b-a3b": "sdar-moe", "llada2.2-flash": "llada2.2"}
    kind = special.get(checkpoint.shape, KIND[checkpoint.family])
    folder = write_block_checkpoint(tmp_path / checkpoint.name, kind)
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    assert lm.checkpoint is checkpoint and lm.chat_default
    r = checkpoint.recommended
    assert recommended_method(lm.checkpoint, None) == r.decoder
    result = lm.generate([[5, 6, 7, 8, 9]], gen_length=2 * r.block_length)[0]
    assert result.method == r.decoder and len(result.steps_per_block) >= 2
    options, taken = recommended_options(
        lm.checkpoint,
        r.decoder,
        gen_length=None,
        block_length=None,
        steps=None,
        temperature=None,
        threshold=None,
    )
    assert taken == ["gen_length", "block_length", "steps", "temperature", "threshold"]
    assert options["threshold"] == r.threshold
    other, _ = recommended_options(lm.checkpoint, "cai", gen_length=None, threshold=None)
    assert other["threshold"] is None  # another decoder keeps its own threshold
    assert "source" not in r.source and ("model card" in r.source or "generate" in r.source)


def test_models_reads_decoders_and_cache_modes_from_the_registries(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for c in BLOCK:
        assert c.hub_id in out
    for block_causal, kind in ((False, "full-sequence"), (True, "block-diffusion")):
        methods, caches = applicable(ModelTraits("x", block_causal, (32,) if block_causal else ()))
        assert f"Decoders (--method) of {kind} models: {', '.join(methods)}" in out
        assert f"Cache modes (--cache) of {kind} models: {', '.join(caches)}" in out
    listed = set(applicable(ModelTraits("x", False))[1]) | set(applicable(ModelTraits("x", True, (32,)))[1])
    assert listed == set(CACHE_MODES)  # block, subblock, dkv, dkv-greedy, elastic included
    assert "fastdllm-v2" in applicable(ModelTraits("x", True, (32,)))[0]
    assert "fastdllm-v2" not in applicable(ModelTraits("x", False))[0]
    assert "wino" not in applicable(ModelTraits("x", True, (32,)))[0]  # its cache none becomes block: refused


def test_models_memory_of_a_block_checkpoint(capsys):
    import json

    assert (
        main(["models", "--model", "Efficient-Large-Model/Fast_dLLM_v2_7B", "--length", "1024", "--json"])
        == 0
    )
    m = json.loads(capsys.readouterr().out)
    kv = 2 * 28 * 4 * 128 * 1024 * 2  # K and V, 28 layers, 4 key/value heads of 128, bf16
    assert m["cache_bytes_per_request"] == {"block": kv, "subblock": kv, "none": 0}
    assert "method fastdllm-v2, threshold 0.9" in m["recommended"]


@pytest.mark.parametrize(
    "shape, flag, runs",
    [
        ("fastdllm-v2-1.5b", ["--sub-block", "4"], "fastdllm-v2"),
        ("llada2.1-mini", ["--editing-threshold", "0.6"], "llada2.1-quality"),  # the model card's Q mode
    ],
)
def test_cli_flags_of_the_checkpoints_own_decoder(tmp_path, capsys, shape, flag, runs):
    """With no --method, a flag only the checkpoint's own decoder reads is checked against that decoder,
    not cai's; one it does not read is still refused (exit 2, one line naming it)."""
    checkpoint = next(c for c in BLOCK if c.shape == shape)
    folder = write_block_checkpoint(tmp_path / checkpoint.name, KIND[checkpoint.family])
    base = [
        "generate",
        "hi",
        "--model",
        str(folder),
        "--gen-length",
        str(2 * checkpoint.recommended.block_length),
    ]
    assert main([*base, *flag, "--json"]) == 0
    assert f'"method": "{runs}"' in capsys.readouterr().out
    if runs == "llada2.1-quality":
        assert main([*base, "--sub-block", "4"]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "sub_block does not apply to method 'llada2.1-quality'" in err
