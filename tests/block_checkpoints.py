"""Tiny random LLaDA2, SDAR, Fast-dLLM v2, Stable-DiffCoder and RND1 checkpoints in the official file
layout, for tests.

write_block_checkpoint(path, "llada2" | "sdar" | "sdar-moe" | "fastdllm_v2" | "stable_diffcoder" | "rnd1")
writes config.json with the
official field names, tokenizer.json / tokenizer_config.json (the generated tokenizer,
chat template and special tokens) and sharded safetensors with an index. The tensor
names are spelled out here from the official modeling files, independently of the
model modules, so a module that drifted from them fails to load these files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from caidllm.models.block_random import OFFICIAL, TOKENIZERS, tokenizer_files
from caidllm.models.generated_tokenizer import build_tokenizer

SMALL = {
    "llada2": {
        **OFFICIAL["llada2-mini"],
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rotary_dim": 4,
        "intermediate_size": 48,
        "moe_intermediate_size": 8,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "max_position_embeddings": 256,
        "torch_dtype": "float32",
    },
    # LLaDA2.2: block routing (a pool of 4 of the 8 experts per block of 32) and edit tokens (set below)
    "llada2.2": {"expert_capacity": 4, "block_size": 32},
    "sdar": {
        **OFFICIAL["sdar-1.7b"],
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 48,
        "max_position_embeddings": 256,
        "torch_dtype": "float32",
    },
    "sdar-moe": {
        **OFFICIAL["sdar-30b-a3b"],
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 48,
        "moe_intermediate_size": 8,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 256,
        "torch_dtype": "float32",
    },
    "fastdllm_v2": {
        **OFFICIAL["fastdllm-v2-1.5b"],
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    },
    # Llama layout (Stable-DiffCoder) and Qwen3-MoE layout (RND1, full-sequence): the 2026 families.
    "stable_diffcoder": {
        **OFFICIAL["stable-diffcoder-8b"],
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "max_position_embeddings": 256,
        "torch_dtype": "float32",
    },
    "rnd1": {
        **OFFICIAL["rnd1-30b-a3b"],
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "moe_intermediate_size": 8,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 256,
        "torch_dtype": "float32",
    },
}
SMALL["llada2.2"] = {**SMALL["llada2"], **SMALL["llada2.2"]}
FAMILIES = {
    "llada2": "llada2",
    "llada2.2": "llada2",
    "sdar": "sdar",
    "sdar-moe": "sdar",
    "fastdllm_v2": "fastdllm_v2",
    "stable_diffcoder": "stable_diffcoder",
    "rnd1": "rnd1",
}


def write_block_checkpoint(
    path, kind: str = "llada2", *, seed: int = 0, config_overrides=None, head_scale: float = 1.0
) -> Path:
    """Write a tiny random checkpoint of `kind` ("llada2", "sdar", "sdar-moe", "fastdllm_v2") into `path`;
    head_scale multiplies the LM head (sharper predictions: confidences spread over (0, 1))."""
    family = FAMILIES[kind]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(TOKENIZERS[family]["specials"])
    tokenizer.save(str(path / "tokenizer.json"))
    config = {**SMALL[kind], "vocab_size": -(-tokenizer.get_vocab_size() // 64) * 64}
    tok_config, ids = tokenizer_files(family, config["max_position_embeddings"])
    config.update(ids)
    if kind == "llada2.2":  # two ids of the padded vocabulary past the tokenizer's
        config.update(delete_token_id=config["vocab_size"] - 2, split_token_id=config["vocab_size"] - 1)
    config.update(config_overrides or {})
    _write_json(path / "config.json", config)
    _write_json(path / "tokenizer_config.json", tok_config)
    g = torch.Generator().manual_seed(seed)
    if family == "llada2":
        tensors = _tensors(config, g, "model.word_embeddings.weight", _llada2_attention, _llada2_feed_forward)
    elif family in ("sdar", "rnd1"):  # RND1: Qwen3-MoE's names, as SDAR-30B-A3B's
        tensors = _tensors(config, g, "model.embed_tokens.weight", _sdar_attention, _sdar_feed_forward)
    elif family == "stable_diffcoder":
        tensors = _tensors(config, g, "model.embed_tokens.weight", _llama_attention, _sdar_feed_forward)
    else:
        tensors = _tensors(config, g, "model.embed_tokens.weight", _qwen2_attention, _sdar_feed_forward)
    tensors["lm_head.weight"] *= head_scale
    _write_shards(path, tensors)
    return path


def _linear(g, n_out, n_in):
    return torch.randn(n_out, n_in, generator=g) * n_in**-0.5


def _norm(g, d):
    return 1.0 + 0.1 * torch.randn(d, generator=g)


def _swiglu(t, g, prefix, d, inner):
    t[prefix + "gate_proj.weight"] = _linear(g, inner, d)
    t[prefix + "up_proj.weight"] = _linear(g, inner, d)
    t[prefix + "down_proj.weight"] = _linear(g, d, inner)


def _experts(t, g, prefix, c):
    d = c["hidden_size"]
    t[prefix + "gate.weight"] = _linear(g, c["num_experts"], d)
    for e in range(c["num_experts"]):
        _swiglu(t, g, f"{prefix}experts.{e}.", d, c["moe_intermediate_size"])


def _tensors(c, g, embedding: str, attention, feed_forward):
    """The whole checkpoint: embedding, per layer the two norms, the family's attention and
    feed-forward tensors (written by `attention(t, g, prefix, c)` / `feed_forward(...)`), the
    final norm and the untied head."""
    d, V = c["hidden_size"], c["vocab_size"]
    t = {embedding: torch.randn(V, d, generator=g)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = _norm(g, d)
        attention(t, g, p, c)
        t[p + "post_attention_layernorm.weight"] = _norm(g, d)
        feed_forward(t, g, p, c, i)
    t["model.norm.weight"] = _norm(g, d)
    t["lm_head.weight"] = _linear(g, V, d)
    return t


def _llada2_attention(t, g, p, c):
    d, hd, h, kv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    t[p + "attention.query_key_value.weight"] = _linear(g, (h + 2 * kv) * hd, d)
    t[p + "attention.query_layernorm.weight"] = _norm(g, hd)
    t[p + "attention.key_layernorm.weight"] = _norm(g, hd)
    t[p + "attention.dense.weight"] = _linear(g, d, h * hd)


def _llada2_feed_forward(t, g, p, c, layer):
    if layer < c["first_k_dense_replace"]:
        _swiglu(t, g, p + "mlp.", c["hidden_size"], c["intermediate_size"])
        return
    _experts(t, g, p + "mlp.", c)
    t[p + "mlp.gate.expert_bias"] = 0.05 * torch.randn(c["num_experts"], generator=g)
    _swiglu(
        t,
        g,
        p + "mlp.shared_experts.",
        c["hidden_size"],
        c["moe_intermediate_size"] * c["num_shared_experts"],
    )


def _sdar_attention(t, g, p, c):
    d, hd, h, kv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    for name, n_out in (("q_proj", h * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        t[p + f"self_attn.{name}.weight"] = _linear(g, n_out, d)
    t[p + "self_attn.o_proj.weight"] = _linear(g, d, h * hd)
    t[p + "self_attn.q_norm.weight"] = _norm(g, hd)
    t[p + "self_attn.k_norm.weight"] = _norm(g, hd)


def _qwen2_attention(t, g, p, c):
    """Fast-dLLM v2 (Qwen2.5): q/k/v with biases, o_proj without, no QK-norm."""
    d, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = d // h
    for name, n_out in (("q_proj", h * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        t[p + f"self_attn.{name}.weight"] = _linear(g, n_out, d)
        t[p + f"self_attn.{name}.bias"] = 0.1 * torch.randn(n_out, generator=g)
    t[p + "self_attn.o_proj.weight"] = _linear(g, d, h * hd)


def _llama_attention(t, g, p, c):
    """Stable-DiffCoder (transformers' Llama): q/k/v/o without biases, no QK-norm."""
    d, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = d // h
    for name, n_out in (("q_proj", h * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        t[p + f"self_attn.{name}.weight"] = _linear(g, n_out, d)
    t[p + "self_attn.o_proj.weight"] = _linear(g, d, h * hd)


def _sdar_feed_forward(t, g, p, c, layer):
    if c.get("num_experts"):
        _experts(t, g, p + "mlp.", c)
    else:
        _swiglu(t, g, p + "mlp.", c["hidden_size"], c["intermediate_size"])


def _write_shards(path: Path, tensors: dict):
    """Two shards and model.safetensors.index.json, as the official checkpoints ship."""
    names = list(tensors)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in shard}, str(path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(
        path / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map}
    )


def _write_json(path: Path, obj):
    path.write_text(json.dumps(obj, indent=2) + "\n")
