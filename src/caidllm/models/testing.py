"""Tiny random checkpoints in the official LLaDA / Dream layout, for tests.

`write_random_checkpoint(path, family)` writes what the real checkpoints
ship (config.json with the official field names, safetensors weights with the
official tensor names, optionally sharded with an index, tokenizer.json and
tokenizer_config.json with the chat template and special tokens), only tiny:
a byte-level BPE of a few hundred tokens, d_model 32, 2 layers. The tensor
names are spelled out here independently of the model modules, so a loader
that drifted from the official names would fail on these files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from ..errors import InputError

SPECIAL_TOKENS = {
    "llada": ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"],
}

# Words that get their own BPE token (with and without a leading space);
# everything else falls back to single bytes, so any text round-trips.
WORDS = (
    "the a an is are was of to and in on for it that this with as be what how many "
    "answer question user assistant system you he she they we has have had more less "
    "than total each per so then if not yes no true false step"
).split()

LLADA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
DREAM_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = 'You are a helpful assistant.' %}{% set turns = messages %}{% endif %}"
    "<|im_start|>system\n{{ system }}<|im_end|>\n"
    "{% for message in turns %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SIZES = {  # tiny defaults; Dream uses grouped-query attention like the real one
    "llada": dict(hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=4, intermediate_size=64,
                  max_length=1024, rope_theta=500000.0, tie_embeddings=False, vocab_size=None),
    "dream": dict(hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64,
                  max_length=1024, rope_theta=1000000.0, tie_embeddings=False, vocab_size=None),
}


def write_random_checkpoint(path, family="llada", *, sharded=False, seed=0, dtype="float32",
                            config_overrides=None, **sizes) -> Path:
    """Write a tiny random `family` checkpoint into folder `path`; returns it.

    sizes: hidden_size, n_layers, n_heads, n_kv_heads, intermediate_size,
    max_length, rope_theta, tie_embeddings, vocab_size (default: the
    tokenizer's size rounded up to a multiple of 64, like the real models'
    padded embeddings). config_overrides: keys merged into config.json last
    (e.g. {"caidllm_confidence_gating": False}). Same seed, same files.
    """
    if family not in SPECIAL_TOKENS:
        raise InputError(f"unknown family {family!r}; expected 'llada' or 'dream'")
    unknown = set(sizes) - set(SIZES[family])
    if unknown:
        raise InputError(f"unknown size overrides {sorted(unknown)}; expected some of {sorted(SIZES[family])}")
    s = {**SIZES[family], **sizes}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    specials = SPECIAL_TOKENS[family]
    tokenizer = build_tokenizer(specials)
    tokenizer.save(str(path / "tokenizer.json"))
    n_tokens = tokenizer.get_vocab_size()
    s["vocab_size"] = s["vocab_size"] or -(-n_tokens // 64) * 64
    if s["vocab_size"] < n_tokens:
        raise InputError(f"vocab_size {s['vocab_size']} is smaller than the tokenizer ({n_tokens} tokens)")

    ids = {t: i for i, t in enumerate(specials)}
    config, tok_config = (_llada_configs if family == "llada" else _dream_configs)(s, ids, dtype)
    config.update(config_overrides or {})
    _write_json(path / "config.json", config)
    tok_config["added_tokens_decoder"] = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
        for t, i in ids.items()
    }
    _write_json(path / "tokenizer_config.json", tok_config)

    g = torch.Generator().manual_seed(seed)
    tensors = (_llada_tensors if family == "llada" else _dream_tensors)(s, g)
    tensors = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in tensors.items()}
    _write_weights(path, tensors, sharded)
    return path


def generated_tokenizer(family: str, max_length: int):
    """The generated tokenizer of `family` as a PreTrainedTokenizerFast (chat template and special
    tokens as in a written checkpoint), and the config.json token-id fields that go with it."""
    from .loading import fast_tokenizer

    specials = SPECIAL_TOKENS[family]
    ids = {t: i for i, t in enumerate(specials)}
    s = {**SIZES[family], "max_length": max_length, "vocab_size": 0}
    config, tok_config = (_llada_configs if family == "llada" else _dream_configs)(s, ids, "float32")
    tokenizer = fast_tokenizer(tok_config, tok_config["chat_template"], tokenizer_object=build_tokenizer(specials))
    fields = {k: config[k] for k in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id") if k in config}
    if family == "llada":
        fields["bos_token_id"] = ids["<|startoftext|>"]
    return tokenizer, fields


def build_tokenizer(specials: list[str]) -> Tokenizer:
    """Byte-level BPE: special tokens first (small ids), then the 256 byte
    symbols, then one merge chain per word in WORDS. Built, not trained, so it
    is the same every time."""
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges = []

    def merge(a, b):
        if a + b not in vocab:
            merges.append((a, b))
            vocab[a + b] = len(vocab)

    for word in WORDS:
        for i in range(1, len(word)):  # left-to-right chain: t+h, th+e
            merge(word[:i], word[i])
        merge("\u0120", word)  # then " the" (byte-level shows " " as Ġ) as one token
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def _llada_configs(s, ids, dtype):
    config = {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "attention_layer_norm": False,
        "bias_for_layer_norm": False,
        "block_type": "llama",
        "d_model": s["hidden_size"],
        "embedding_size": s["vocab_size"],
        "eos_token_id": ids["<|endoftext|>"],
        "include_bias": False,
        "include_qkv_bias": False,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "mask_token_id": ids["<|mdm_mask|>"],
        "max_sequence_length": s["max_length"],
        "mlp_hidden_size": s["intermediate_size"],
        "n_heads": s["n_heads"],
        "n_kv_heads": s["n_kv_heads"],
        "n_layers": s["n_layers"],
        "pad_token_id": ids["<|endoftext|>"],
        "rms_norm_eps": 1e-5,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": s["rope_theta"],
        "scale_logits": False,
        "torch_dtype": dtype,
        "vocab_size": s["vocab_size"],
        "weight_tying": s["tie_embeddings"],
    }
    tok_config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "chat_template": LLADA_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": s["max_length"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return config, tok_config


def _dream_configs(s, ids, dtype):
    eos = ids["<|endoftext|>"]
    config = {
        "architectures": ["DreamModel"],
        "model_type": "Dream",
        "bos_token_id": eos,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"],
        "mask_token_id": ids["<|mask|>"],
        "max_position_embeddings": s["max_length"],
        "num_attention_heads": s["n_heads"],
        "num_hidden_layers": s["n_layers"],
        "num_key_value_heads": s["n_kv_heads"],
        "pad_token_id": eos,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": s["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": s["tie_embeddings"],
        "torch_dtype": dtype,
        "use_sliding_window": False,
        "vocab_size": s["vocab_size"],
    }
    tok_config = {
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": DREAM_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": s["max_length"],
    }
    return config, tok_config


# Random weights scaled like a trained model's activations (std 1/sqrt(fan_in)),
# so logits are O(1) and cache or shift mistakes show up well above float noise.
def _linear(g, n_out, n_in):
    return torch.randn(n_out, n_in, generator=g) * n_in**-0.5


def _norm(g, d):
    return 1.0 + 0.1 * torch.randn(d, generator=g)


def _llada_tensors(s, g):
    d, h, V = s["hidden_size"], s["intermediate_size"], s["vocab_size"]
    kv = s["n_kv_heads"] * (d // s["n_heads"])
    t = {"model.transformer.wte.weight": torch.randn(V, d, generator=g)}
    for i in range(s["n_layers"]):
        p = f"model.transformer.blocks.{i}."
        t[p + "attn_norm.weight"] = _norm(g, d)
        t[p + "q_proj.weight"] = _linear(g, d, d)
        t[p + "k_proj.weight"] = _linear(g, kv, d)
        t[p + "v_proj.weight"] = _linear(g, kv, d)
        t[p + "attn_out.weight"] = _linear(g, d, d)
        t[p + "ff_norm.weight"] = _norm(g, d)
        t[p + "ff_proj.weight"] = _linear(g, h, d)
        t[p + "up_proj.weight"] = _linear(g, h, d)
        t[p + "ff_out.weight"] = _linear(g, d, h)
    t["model.transformer.ln_f.weight"] = _norm(g, d)
    if not s["tie_embeddings"]:
        t["model.transformer.ff_out.weight"] = _linear(g, V, d)
    return t


def _dream_tensors(s, g):
    d, h, V = s["hidden_size"], s["intermediate_size"], s["vocab_size"]
    qd = d  # n_heads * head_dim
    kv = s["n_kv_heads"] * (d // s["n_heads"])
    t = {"model.embed_tokens.weight": torch.randn(V, d, generator=g)}
    for i in range(s["n_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = _norm(g, d)
        for name, n_out in (("q_proj", qd), ("k_proj", kv), ("v_proj", kv)):
            t[p + f"self_attn.{name}.weight"] = _linear(g, n_out, d)
            t[p + f"self_attn.{name}.bias"] = 0.1 * torch.randn(n_out, generator=g)
        t[p + "self_attn.o_proj.weight"] = _linear(g, d, qd)
        t[p + "post_attention_layernorm.weight"] = _norm(g, d)
        t[p + "mlp.gate_proj.weight"] = _linear(g, h, d)
        t[p + "mlp.up_proj.weight"] = _linear(g, h, d)
        t[p + "mlp.down_proj.weight"] = _linear(g, d, h)
    t["model.norm.weight"] = _norm(g, d)
    if not s["tie_embeddings"]:
        t["lm_head.weight"] = _linear(g, V, d)
    return t


def _write_weights(path: Path, tensors: dict, sharded: bool):
    if not sharded:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(tensors)
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    weight_map = {}
    for k, shard in enumerate(shards, 1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, str(path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(path / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def _write_json(path: Path, obj):
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
