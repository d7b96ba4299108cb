"""tests/helpers/random_model.py: a `random:` model written as a checkpoint folder loads back
with the same config, tokenizer and logits (exactly, in the written dtype), its tensors under
the official names (one per expert), sharded when asked; shapes it cannot write are named."""

import json

import pytest
import torch
from safetensors import safe_open

import caidllm
from caidllm.errors import InputError
from helpers.random_model import write_random_model

MOE = (
    "random:llada-moe-7b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=4"
    "&expert_intermediate_size=32&num_experts=8&num_experts_per_tok=2&vocab_size=512&max_position_embeddings=256"
)
DENSE = "random:llada-8b?n_layers=2&d_model=64&n_heads=4&n_kv_heads=4&mlp_hidden_size=96&vocab_size=512"


def _names(folder) -> set[str]:
    names = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            names |= set(f.keys())
    return names


@pytest.mark.parametrize("name, shard_mb", [(MOE, 0.1), (DENSE, 2048)])
def test_the_folder_loads_back_with_the_random_models_logits(tmp_path, name, shard_mb):
    folder = write_random_model(tmp_path / "m", name, shard_mb=shard_mb)
    drawn = caidllm.load(name, device="cpu", dtype="float32")
    loaded = caidllm.load(folder, device="cpu", dtype="float32")
    assert loaded.config.family == drawn.config.family and loaded.config.moe == drawn.config.moe
    assert (loaded.config.vocab_size, loaded.config.n_layers, loaded.config.mask_id) == (
        drawn.config.vocab_size,
        drawn.config.n_layers,
        drawn.config.mask_id,
    )
    text = "what is the answer to the question"
    assert loaded.tokenizer(text)["input_ids"] == drawn.tokenizer(text)["input_ids"]
    ids = torch.randint(3, len(drawn.tokenizer), (2, 24), generator=torch.Generator().manual_seed(0))
    assert torch.equal(loaded.logits(ids), drawn.logits(ids))
    options = dict(gen_length=8, block_length=8, steps=8)
    assert (
        loaded.generate(["hello"], **options)[0].token_ids
        == drawn.generate(["hello"], **options)[0].token_ids
    )


def test_moe_experts_are_written_one_tensor_each_under_the_official_names(tmp_path):
    folder = write_random_model(tmp_path / "m", MOE, shard_mb=0.1)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and shards == {f.name for f in folder.glob("*.safetensors")}
    names = _names(folder)
    assert set(index["weight_map"]) == names
    assert {f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(8)} <= names
    assert {
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.self_attn.q_norm.weight",
    } <= names
    assert not any(n.endswith(("experts.gate_proj", "experts.up_proj", "experts.down_proj")) for n in names)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LLaDAMoEModelLM"] and config["num_experts"] == 8
    assert config["torch_dtype"] == "float32" and config["moe_layer_freq"] == [1, 1]


def test_bfloat16_is_written_and_loaded_as_drawn(tmp_path):
    folder = write_random_model(tmp_path / "m", DENSE, dtype="bfloat16")
    assert (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").exists()
    loaded = caidllm.load(folder, device="cpu", dtype="bfloat16")
    drawn = caidllm.load(DENSE, device="cpu", dtype="bfloat16")
    ids = torch.arange(3, 19)[None]
    assert torch.equal(loaded.logits(ids), drawn.logits(ids))


BLOCK = {  # the block-diffusion families (their own generated tokenizers), tiny
    "llada2": "random:llada2-mini?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
    "&num_key_value_heads=2"
    "&head_dim=16&rotary_dim=8&intermediate_size=128&moe_intermediate_size=32&num_experts=16&vocab_size=512",
    "sdar": "random:sdar-1.7b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
    "&head_dim=16&intermediate_size=128&vocab_size=512",
    "sdar-moe": "random:sdar-30b-a3b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
    "&num_key_value_heads=2"
    "&head_dim=16&intermediate_size=128&moe_intermediate_size=32&num_experts=16&vocab_size=512",
}


@pytest.mark.parametrize("family", BLOCK)
def test_block_diffusion_shapes_load_back_with_their_tokenizer_and_logits(tmp_path, family):
    folder = write_random_model(tmp_path / "m", BLOCK[family])
    drawn = caidllm.load(BLOCK[family], device="cpu", dtype="float32")
    loaded = caidllm.load(folder, device="cpu", dtype="float32")
    assert (loaded.config.family, loaded.config.moe, loaded.config.mask_id, loaded.config.eos_id) == (
        drawn.config.family,
        drawn.config.moe,
        drawn.config.mask_id,
        drawn.config.eos_id,
    )
    chat = [{"role": "user", "content": "what is the answer"}]
    assert loaded.tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ) == drawn.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (
        loaded.tokenizer("what is the answer")["input_ids"]
        == drawn.tokenizer("what is the answer")["input_ids"]
    )
    ids = torch.arange(3, 35)[None]
    assert torch.equal(loaded.logits(ids), drawn.logits(ids))


def test_shapes_it_cannot_write_are_named(tmp_path):
    with pytest.raises(InputError, match="unknown dtype 'float13'"):
        write_random_model(tmp_path / "b", DENSE, dtype="float13")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn", "complex64"])
def test_a_dtype_no_checkpoint_holds_is_refused_before_anything_is_written(tmp_path, dtype):
    """torch names that are not a model dtype (int8, float8, complex) are named up front, as an
    unknown name is, and leave no half-written folder (no tokenizer and config without weights)."""
    with pytest.raises(InputError, match=f"unknown dtype '{dtype}'; expected float32, bfloat16 or float16"):
        write_random_model(tmp_path / "m", DENSE, dtype=dtype)
    assert not (tmp_path / "m").exists()
