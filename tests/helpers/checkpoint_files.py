"""Tiny random-weight folders in the file layout of each known public checkpoint, for tests.

write_checkpoint(path, hub_id) writes what that checkpoint's hub repository ships, only tiny:
config.json (the official fields of its random: shape, sizes shrunk, token ids of the tiny
tokenizer), generation_config.json, tokenizer.json (a word-level tokenizer with the checkpoint's
own special tokens), tokenizer_config.json (those tokens, the chat template of an instruct
model, none for a base model), special_tokens_map.json and safetensors weights whose tensor
names are spelled out here from the official layouts (not read from caidllm's modules), with
a shard index when sharded. The folder is named after the checkpoint, as a download is.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from caidllm.models.checkpoints import find_checkpoint
from caidllm.models.random_init import OFFICIAL

WORDS = "the a is of to and in what how many answer question user assistant you it 1 2 3 4 5 + = ?".split()

LLADA_TOKENS = dict(
    bos="<|startoftext|>",
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    mask="<|mdm_mask|>",
    extra=["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
)
DREAM_TOKENS = dict(
    bos="<|beginoftext|>",
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    mask="<|mask|>",
    extra=["<|im_start|>", "<|im_end|>"],
)
# DiffuCoder's instruct models fill the canvas tail with their own pad token.
DIFFUCODER_TOKENS = {
    **DREAM_TOKENS,
    "pad": "<|dlm_pad|>",
    "extra": ["<|im_start|>", "<|im_end|>", "<|dlm_pad|>"],
}
LING_TOKENS = dict(
    bos="<|startoftext|>",
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    mask="<|mask|>",
    extra=["<role>", "</role>", "<|role_end|>"],
)

LLADA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LING_TEMPLATE = (
    "{% for m in messages %}<role>{{ 'HUMAN' if m['role'] == 'user' else m['role'] | upper }}</role>"
    "{{ m['content'] }}<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>"
    "{% endif %}"
)

LAYOUT = {  # shape -> (tokens, chat template of its instruct checkpoints, tensor-name writer)
    "llada-8b": (LLADA_TOKENS, LLADA_TEMPLATE, "llada"),
    "mmada-8b": (LLADA_TOKENS, LLADA_TEMPLATE, "llada"),
    "dream-7b": (DREAM_TOKENS, CHATML_TEMPLATE, "dream"),
    "dream-coder-7b": (DREAM_TOKENS, CHATML_TEMPLATE, "dream"),
    "diffucoder-7b": (DIFFUCODER_TOKENS, CHATML_TEMPLATE, "dream"),
    "llada-moe-7b": (LING_TOKENS, LING_TEMPLATE, "moe"),
}
D, LAYERS, HEADS, FF, EXPERTS, TOP_K, EXPERT_FF = 32, 2, 4, 64, 4, 2, 16


def write_checkpoint(path, hub_id: str, *, sharded: bool = False, seed: int = 0) -> Path:
    """A tiny random folder laid out as `hub_id`'s; returns it (path / the checkpoint's name)."""
    checkpoint = find_checkpoint(hub_id)
    tokens, template, layout = LAYOUT[checkpoint.shape]
    folder = Path(path) / checkpoint.name
    folder.mkdir(parents=True, exist_ok=True)
    specials = list(
        dict.fromkeys([tokens["bos"], tokens["eos"], tokens["pad"], tokens["mask"], *tokens["extra"]])
    )
    ids = {t: i for i, t in enumerate(specials)}
    vocab = {**ids, "[UNK]": len(ids), **{w: len(ids) + 1 + i for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(folder / "tokenizer.json"))
    # MMaDA: image codes
    vocab_size = -(-len(vocab) // 16) * 16 + (16 if checkpoint.shape == "mmada-8b" else 0)

    config = json.loads(json.dumps(OFFICIAL[checkpoint.shape]))
    config.update(
        _sizes(layout, vocab_size),
        torch_dtype="float32",
        eos_token_id=ids[tokens["eos"]],
        pad_token_id=ids[tokens["pad"]],
        bos_token_id=ids[tokens["bos"]],
        mask_token_id=ids[tokens["mask"]],
    )
    _write_json(folder / "config.json", config)
    _write_json(
        folder / "generation_config.json",
        {
            "bos_token_id": ids[tokens["bos"]],
            "eos_token_id": ids[tokens["eos"]],
            "pad_token_id": ids[tokens["pad"]],
        },
    )
    tok_config = {
        "bos_token": tokens["bos"],
        "eos_token": tokens["eos"],
        "pad_token": tokens["pad"],
        "mask_token": tokens["mask"],
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for t, i in ids.items()
        },
    }
    if layout == "llada":  # LLaDA's tokenizer_config.json names no mask token: config.json's id is the one
        del tok_config["mask_token"]
    if checkpoint.instruct:
        tok_config["chat_template"] = template
    _write_json(folder / "tokenizer_config.json", tok_config)
    _write_json(
        folder / "special_tokens_map.json",
        {k: tok_config[k] for k in ("bos_token", "eos_token", "pad_token")},
    )

    generator = torch.Generator().manual_seed(seed)
    tensors = TENSORS[layout](vocab_size, generator)
    _write_weights(folder, {k: v.contiguous() for k, v in tensors.items()}, sharded)
    return folder


def _sizes(layout: str, vocab_size: int) -> dict:
    if layout == "llada":
        return dict(
            d_model=D,
            n_layers=LAYERS,
            n_heads=HEADS,
            n_kv_heads=HEADS,
            mlp_hidden_size=FF,
            vocab_size=vocab_size,
            embedding_size=vocab_size,
            max_sequence_length=512,
        )
    common = dict(
        hidden_size=D,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        vocab_size=vocab_size,
        max_position_embeddings=512,
    )
    if layout == "dream":
        return {**common, "num_key_value_heads": 2, "intermediate_size": FF}
    return {
        **common,
        "num_key_value_heads": 2,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "expert_intermediate_size": EXPERT_FF,
        "dense_intermediate_size": FF,
        "moe_layer_freq": [1] * LAYERS,
    }


def _linear(g, rows, cols):
    return torch.randn(rows, cols, generator=g) * cols**-0.5


def _norm(g, n):
    return 1 + 0.1 * torch.randn(n, generator=g)


def _llada_tensors(V, g):
    t = {
        "model.transformer.wte.weight": torch.randn(V, D, generator=g),
        "model.transformer.ln_f.weight": _norm(g, D),
        "model.transformer.ff_out.weight": _linear(g, V, D),
    }
    for i in range(LAYERS):
        p = f"model.transformer.blocks.{i}."
        t.update(
            {
                p + "attn_norm.weight": _norm(g, D),
                p + "ff_norm.weight": _norm(g, D),
                p + "q_proj.weight": _linear(g, D, D),
                p + "k_proj.weight": _linear(g, D, D),
                p + "v_proj.weight": _linear(g, D, D),
                p + "attn_out.weight": _linear(g, D, D),
                p + "ff_proj.weight": _linear(g, FF, D),
                p + "up_proj.weight": _linear(g, FF, D),
                p + "ff_out.weight": _linear(g, D, FF),
            }
        )
    return t


def _qwen_like(V, g, kv_heads, bias):
    hd = D // HEADS
    t = {
        "model.embed_tokens.weight": torch.randn(V, D, generator=g),
        "model.norm.weight": _norm(g, D),
        "lm_head.weight": _linear(g, V, D),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update(
            {
                p + "input_layernorm.weight": _norm(g, D),
                p + "post_attention_layernorm.weight": _norm(g, D),
                p + "self_attn.q_proj.weight": _linear(g, D, D),
                p + "self_attn.o_proj.weight": _linear(g, D, D),
                p + "self_attn.k_proj.weight": _linear(g, kv_heads * hd, D),
                p + "self_attn.v_proj.weight": _linear(g, kv_heads * hd, D),
            }
        )
        if bias:
            for name, n in (("q", D), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                t[p + f"self_attn.{name}_proj.bias"] = 0.02 * torch.randn(n, generator=g)
    return t


def _dream_tensors(V, g):
    t = _qwen_like(V, g, 2, bias=True)
    for i in range(LAYERS):
        p = f"model.layers.{i}.mlp."
        t.update(
            {
                p + "gate_proj.weight": _linear(g, FF, D),
                p + "up_proj.weight": _linear(g, FF, D),
                p + "down_proj.weight": _linear(g, D, FF),
            }
        )
    return t


def _moe_tensors(V, g):
    t = _qwen_like(V, g, 2, bias=False)
    hd = D // HEADS
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_norm.weight"] = _norm(g, hd)
        t[p + "self_attn.k_norm.weight"] = _norm(g, hd)
        t[p + "mlp.gate.weight"] = _linear(g, EXPERTS, D)
        for e in range(EXPERTS):
            q = f"{p}mlp.experts.{e}."
            t.update(
                {
                    q + "gate_proj.weight": _linear(g, EXPERT_FF, D),
                    q + "up_proj.weight": _linear(g, EXPERT_FF, D),
                    q + "down_proj.weight": _linear(g, D, EXPERT_FF),
                }
            )
    return t


TENSORS = {"llada": _llada_tensors, "dream": _dream_tensors, "moe": _moe_tensors}


def _write_weights(folder: Path, tensors: dict, sharded: bool) -> None:
    if not sharded:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for k, part in enumerate(halves, start=1):
        file = f"model-{k:05d}-of-{len(halves):05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(
        folder / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map}
    )


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
