"""Every known public checkpoint loads from a folder in its own file layout (tiny random
weights, tests/checkpoint_files.py) through the ordinary loader, with its special ids read from
its own files, its chat template (instruct) or raw text (base), and its recommended settings;
each random: shape has its official config and exact parameter count."""

import json

import pytest
import torch

import caidllm
from caidllm.errors import InputError
from caidllm.models.checkpoints import KNOWN, find_checkpoint, identify, recommended_options
from caidllm.models.random_init import parameter_count
from helpers.checkpoint_files import LAYOUT, write_checkpoint

# The full-sequence checkpoints (the block-diffusion ones: tests/test_block_checkpoints_known.py).
FULL_SEQUENCE = [c for c in KNOWN if c.shape in LAYOUT]

# Exact parameter counts of the official configs (meta device), against the official figures:
# LLaDA-8B 8,015,581,184 (its safetensors, REFERENCE.md); Dream-7B and the coders are Qwen2.5-7B's
# shape, 7,615,616,512; MMaDA-8B is LLaDA-8B with 8192 more embedding and head rows (image codes);
# LLaDA-MoE-7B-A1B "7B total, 1.4B active" (model card), 14.7 GB of bf16 safetensors.
OFFICIAL_COUNTS = {
    "llada-8b": 8_015_581_184,
    "mmada-8b": 8_015_581_184 + 2 * 8192 * 4096,
    "dream-7b": 7_615_616_512,
    "dream-coder-7b": 7_615_616_512,
    "diffucoder-7b": 7_615_616_512,
    "llada-moe-7b": 7_356_880_896,
}


@pytest.mark.parametrize("shape", sorted(OFFICIAL_COUNTS))
def test_random_shape_has_the_official_parameter_count(shape):
    lm = caidllm.load(f"random:{shape}", device="meta")
    assert parameter_count(lm.model) == OFFICIAL_COUNTS[shape]


def test_llada_moe_counts_match_its_card():
    from caidllm.models.inventory import parameter_counts

    total, active = parameter_counts(caidllm.load("random:llada-moe-7b", device="meta"))
    assert total * 2 / 1e9 == pytest.approx(14.71, abs=0.01)  # the bf16 safetensors: 14.7 GB
    assert round(active / 1e9, 1) == 1.4  # "1.4B activated" (embedding lookup excluded)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        c.hub_id: write_checkpoint(root, c.hub_id, sharded=c.hub_id.endswith("Instruct"))
        for c in FULL_SEQUENCE
    }


@pytest.mark.parametrize("hub_id", [c.hub_id for c in FULL_SEQUENCE])
def test_every_known_checkpoint_loads_from_its_own_layout(folders, hub_id):
    checkpoint = find_checkpoint(hub_id)
    lm = caidllm.load(folders[hub_id], device="cpu", dtype="float32")
    assert lm.checkpoint is checkpoint and lm.config.family == checkpoint.family
    tok = lm.tokenizer
    mask = "<|mdm_mask|>" if checkpoint.family == "llada" else "<|mask|>"
    assert lm.config.mask_id == tok.convert_tokens_to_ids(mask)
    assert lm.chat_default is checkpoint.instruct and bool(tok.chat_template) is checkpoint.instruct
    assert lm.config.confidence_gating is checkpoint.recommended.confidence_gating
    assert lm.config.cache_refresh_every == checkpoint.recommended.refresh_every
    ends = {tok.convert_ids_to_tokens(i) for i in lm.config.eos_ids}
    assert "<|endoftext|>" in ends and mask not in ends
    if checkpoint.shape == "diffucoder-7b":
        assert "<|dlm_pad|>" in ends  # DiffuCoder fills the tail with its own pad token
    if checkpoint.family == "llada_moe":
        assert "<|role_end|>" in ends
    ids = torch.tensor([[5, 6, 7, lm.config.mask_id, lm.config.mask_id]])
    assert lm.logits(ids).shape == (1, 5, lm.config.vocab_size)


@pytest.mark.parametrize(
    "hub_id", ["GSAI-ML/LLaDA-8B-Base", "inclusionAI/LLaDA-MoE-7B-A1B-Instruct", "apple/DiffuCoder-7B-cpGRPO"]
)
def test_known_checkpoint_decodes_with_its_recommended_settings(folders, hub_id):
    lm = caidllm.load(folders[hub_id], device="cpu", dtype="float32")
    result = lm.generate(["what is 2 + 3 ?"], gen_length=32)  # block_length from the recommendation (32)
    assert result[0].steps_per_block and len(result[0].steps_per_block) == 1
    options, taken = recommended_options(lm.checkpoint)
    assert taken == ["gen_length", "block_length", "steps", "temperature"]
    assert options["gen_length"] == lm.checkpoint.recommended.gen_length


def test_base_model_decodes_raw_text_and_a_chat_call_says_why_not(folders):
    lm = caidllm.load(folders["GSAI-ML/LLaDA-8B-Base"], device="cpu", dtype="float32")
    assert lm.chat_default is False
    with pytest.raises(InputError, match="LLaDA-8B-Base has no chat template .* chat=False .*--no-chat"):
        lm.generate(["what is 2 + 3 ?"], chat=True, gen_length=32)


def test_recommendation_fills_only_what_is_unset():
    llada = find_checkpoint("GSAI-ML/LLaDA-8B-Instruct")
    options, taken = recommended_options(llada, gen_length=64, block_length=None, steps=None, temperature=0.5)
    assert options == dict(gen_length=64, block_length=32, steps=None, temperature=0.5) and taken == [
        "block_length"
    ]
    options, taken = recommended_options(llada, gen_length=48, block_length=None)  # 32 does not divide 48
    assert options["block_length"] is None and taken == ["temperature"]
    assert recommended_options(None, gen_length=None) == ({"gen_length": None}, [])


def test_every_recommendation_names_its_source():
    for checkpoint in KNOWN:
        r = checkpoint.recommended
        assert r.source and r.gen_length % r.block_length == 0 and r.steps >= 1
        assert "model card" in r.source or "generate" in r.source


def test_identify_by_folder_name_hub_cache_path_name_or_path_and_explicit_field(tmp_path):
    dream = find_checkpoint("Dream-org/Dream-v0-Base-7B")
    assert identify(tmp_path / "Dream-v0-Base-7B", {}) is dream
    cache = tmp_path / "models--Dream-org--Dream-v0-Base-7B" / "snapshots" / "abc"
    assert identify(cache, {}) is dream
    assert identify(tmp_path / "x", {"_name_or_path": "/data/Dream-v0-Base-7B/"}) is dream
    assert identify(tmp_path / "x", {"caidllm_checkpoint": "dream-org/dream-v0-base-7b"}) is dream
    assert identify(tmp_path / "x", {}) is None


def test_unknown_folder_keeps_the_family_defaults(folders, tmp_path):
    import shutil

    path = shutil.copytree(folders["GSAI-ML/LLaDA-8B-Instruct"], tmp_path / "my-finetune")
    lm = caidllm.load(path, device="cpu", dtype="float32")
    assert lm.checkpoint is None and lm.chat_default is True  # it has a chat template
    config = json.loads((path / "config.json").read_text())
    config["caidllm_checkpoint"] = "GSAI-ML/LLaDA-8B-Base"  # the user says which it is
    (path / "config.json").write_text(json.dumps(config))
    assert caidllm.load(path, device="cpu", dtype="float32").chat_default is False


def test_readme_model_table_matches_the_known_checkpoints():
    from pathlib import Path

    # README's table or a docs page's (the 2026 checkpoints: docs/models-derived.md; README is not to grow).
    root = Path(__file__).resolve().parent.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    readme = "\n".join(page.read_text() for page in pages)
    for c in KNOWN:
        r = c.recommended
        row = next((line for line in readme.splitlines() if line.startswith(f"| {c.hub_id} |")), None)
        assert row is not None, c.hub_id
        assert f"| {c.family} (" in row
        assert f"| {r.gen_length} / {r.block_length} / {r.steps} / {r.temperature:g} |" in row
        assert f"| {'on' if r.confidence_gating else 'off'}, {r.refresh_every} |" in row
        assert f"| {'yes' if c.instruct else 'no'} |" in row


@pytest.mark.parametrize("method", ["cai", "es-dllm"])
def test_llada_moe_answers_do_not_depend_on_the_batch(folders, method):
    """MoE routing is per token: a prompt's answer alone equals its answer in a batch (left-padded)."""
    lm = caidllm.load(folders["inclusionAI/LLaDA-MoE-7B-A1B-Base"], device="cpu", dtype="float32")
    prompts = ["what is 2 + 3 ?", "how many", "the answer of the question is"]
    alone = [lm.generate([p], method=method, gen_length=16, block_length=8)[0].token_ids for p in prompts]
    together = lm.generate(prompts, method=method, gen_length=16, block_length=8, batch_size=3)
    assert [r.token_ids for r in together] == alone
    ids = torch.randint(0, len(lm.tokenizer), (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, :4] = False
    torch.testing.assert_close(lm.logits(ids, mask)[1, 4:], lm.logits(ids[1:, 4:])[0], atol=1e-5, rtol=1e-5)
