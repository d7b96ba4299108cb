"""A `random:` model (caidllm/models/random_init.py) written out as a checkpoint folder, for
benchmarks that need the same weights in another engine (BENCHMARKS.md, llama.cpp side by side)
at shapes tests/helpers/checkpoints.py does not write (LLaDA-MoE, LLaDA2, SDAR, full widths).

    PYTHONPATH=src:tests python -c "from helpers.random_model import write_random_model as w; \\
        w('ckpt', 'random:llada-moe-7b?num_hidden_layers=2')"

The folder holds config.json (the shape's official fields with its overrides, the generated
tokenizer's token ids, torch_dtype), the generated tokenizer (tokenizer.json,
tokenizer_config.json: LLaDA's or Dream's, models/generated_tokenizer.py, or a block-diffusion
family's, models/block_random.py) and the weights under the official tensor names: the model's own
state_dict, whose stacked experts write one tensor per expert (models/moe_experts.py), in
safetensors shards of at most about `shard_mb` with an index when there is more than one.
Loading the folder in the same dtype gives the random model's logits exactly.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from caidllm.errors import InputError
from caidllm.models import block_random
from caidllm.models.generated_tokenizer import SPECIAL_TOKENS, build_tokenizer, generated_tokenizer
from caidllm.models.random_init import build_random, random_raw_config

from .checkpoints import _write_json, added_tokens_decoder, write_tokenizer

# config.json's torch_dtype spellings of the dtypes a model loads in
DTYPES = (
    "float32",
    "bfloat16",
    "float16",
)


def write_random_model(
    path, name: str, *, dtype: str = "float32", seed: int = 0, shard_mb: float = 2048
) -> Path:
    """Write the random model `name` (a "random:" name, overrides included: every shape, LLaDA2
    and SDAR included) drawn with `seed` in `dtype` into folder `path`; returns it."""
    kind, raw = random_raw_config(name)
    if dtype not in DTYPES:  # checked before anything is written: no half-written folder
        raise InputError(f"unknown dtype {dtype!r}; expected {', '.join(DTYPES[:-1])} or {DTYPES[-1]}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    max_length = int(raw.get("max_sequence_length") or raw["max_position_embeddings"])
    raw.update(_write_generated_tokenizer(path, kind, max_length), torch_dtype=dtype)
    _write_json(path / "config.json", raw)
    lm = build_random(name, torch.device("cpu"), getattr(torch, dtype), seed=seed)
    _write_shards(path, lm.model.state_dict(), shard_mb * 2**20)
    return path


def _write_generated_tokenizer(path: Path, kind: str, max_length: int) -> dict:
    """The generated tokenizer of `kind` into folder `path` (tokenizer.json, tokenizer_config.json
    with its special tokens); returns config.json's token-id fields that go with it."""
    if kind in SPECIAL_TOKENS:  # LLaDA's and Dream's (LLaDA-MoE, MMaDA, DiffuCoder ...)
        write_tokenizer(path, kind, max_length)
        return generated_tokenizer(kind, max_length)[1]
    specials = block_random.TOKENIZERS[kind]["specials"]  # LLaDA2's, SDAR's, Fast-dLLM v2's
    build_tokenizer(specials).save(str(path / "tokenizer.json"))
    tok_config, fields = block_random.tokenizer_files(kind, max_length)
    tok_config["added_tokens_decoder"] = added_tokens_decoder({t: i for i, t in enumerate(specials)})
    _write_json(path / "tokenizer_config.json", tok_config)
    return fields


def _write_shards(path: Path, state: dict, shard_bytes: float) -> None:
    """state's tensors in order, a new shard once one would pass shard_bytes; each tensor
    copied as it is written (the experts' are views of one stack, which safetensors refuses)."""
    shards, size = [[]], 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    files = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)]
    )
    for file, names in zip(files, shards):
        save_file({n: state[n].detach().clone() for n in names}, str(path / file), metadata={"format": "pt"})
    if len(files) > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        weight_map = {n: file for file, names in zip(files, shards) for n in names}
        _write_json(
            path / "model.safetensors.index.json",
            {"metadata": {"total_size": total}, "weight_map": weight_map},
        )
