"""What a user checks before renting a GPU: the families and known checkpoints caidllm runs,
their parameters (total / active per token), context, the decoders and cache modes that
apply, the recommended settings, and for a given model and dtype the memory of its weights
and of the KV cache one request needs at a given length. `caidllm models` prints it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError, ModelLoadError
from .checkpoints import KNOWN, Checkpoint, find_checkpoint, identify
from .families import FAMILIES, get_family, load_config
from .skip import DEFAULT_SCHEDULE, hidden_levels

DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def parameter_counts(lm) -> tuple[int, int]:
    """(total, active): every parameter; those a token's forward multiplies by, i.e. without
    the routed experts it does not use and without the input embedding table (a lookup), as
    MoE model cards count "activated" parameters. `lm`: anything with .model and .config."""
    c = lm.config
    total = sum(p.numel() for p in lm.model.parameters())
    inactive = 0
    if c.moe is not None:
        per_expert = 3 * c.hidden_size * c.moe.moe_intermediate_size
        inactive = (
            (c.n_layers - c.dense_layers) * (c.moe.num_experts - c.moe.num_experts_per_tok) * per_expert
        )
    embedding = 0 if c.tie_embeddings else c.vocab_size * c.hidden_size
    return total, total - inactive - embedding


def cache_bytes(config, length: int, dtype: torch.dtype) -> dict[str, int]:
    """Bytes of cache one request of `length` positions needs, per cache mode: keys and values
    of every layer (dual), twice that while prefix forwards run (their working copy), plus the
    hidden states the early-skip mode keeps (es, default schedule); none keeps nothing. A block-causal
    model's block cache holds every layer's keys and values once."""
    size = DTYPE_BYTES[dtype]
    if get_family(
        config.family
    ).uniform:  # DiffusionGemma: its per-request canvas cache (layers of two shapes)
        with torch.device("meta"):
            return {"canvas": get_family(config.family).model_class(config).cache_bytes(length, size)}
    kv = 2 * config.n_layers * config.n_kv_heads * config.head_dim * length * size
    if get_family(config.family).sequential:  # its causal KV cache (decode/nemotron.py), the block's too
        return {"kv": kv}
    if config.block_causal:  # the exact block cache (and Fast-dLLM v2's within-block cache in it)
        return {"block": kv, "subblock": kv, "none": 0}
    levels = len(hidden_levels(DEFAULT_SCHEDULE, config.n_layers))
    return {"none": 0, "prefix": 2 * kv, "dual": kv, "es": kv + levels * length * config.hidden_size * size}


def family_rows() -> list[dict]:
    """One row per registry entry: its name, the config.json names it answers to, what it is, and
    whether it is block-causal (the decode layer says which decoders and cache modes apply)."""
    return [
        {
            "family": f.name,
            "architectures": list(f.architectures),
            "model_types": list(f.model_types),
            "confidence_gating": f.confidence_gating,
            "cache_refresh_every": f.cache_refresh_every,
            "description": f.description,
            "block_causal": f.block_causal,
            "block_lengths": [],
            "uniform": f.uniform,
            "sequential": f.sequential,
        }
        for f in FAMILIES.values()
    ]


def checkpoint_row(checkpoint: Checkpoint) -> dict:
    """A known checkpoint with the figures of its official shape (built on the meta device)."""
    return {**checkpoint.to_dict(), **shape_figures(checkpoint.shape)}


@functools.cache
def shape_figures(shape: str) -> dict:
    """Architecture, parameters, context, decoders and cache modes of a random: shape (several
    checkpoints share one; built once)."""
    from .loading import load

    lm = load(f"random:{shape}", device="meta")
    total, active = parameter_counts(lm)
    return {
        "architecture": lm.config.raw["architectures"][0],
        "parameters_total": total,
        "parameters_active": active,
        "context": lm.config.max_length,
        "block_causal": lm.config.block_causal,
        "block_lengths": list(lm.config.block_lengths),
    }


def checkpoint_rows() -> list[dict]:
    return [checkpoint_row(c) for c in KNOWN]


@dataclass
class Described:
    """A model's module on the meta device (no memory, no weights read) and its config."""

    name: str
    model: torch.nn.Module
    config: object
    checkpoint: Checkpoint | None


def describe(name: str) -> Described:
    """`name` (random:..., a known checkpoint's hub id or name, a folder, or any hub id) built on
    the meta device from its config.json alone: nothing but config.json is read or fetched."""
    from .hub import download_file, is_hub_id
    from .loading import EMBEDDED, load
    from .random_init import is_random_name

    if is_random_name(name):
        lm = load(name, device="meta")
        return Described(name, lm.model, lm.config, None)
    known = find_checkpoint(name)
    folder = EMBEDDED.get(name, Path(name).expanduser())
    if known is not None and not folder.exists():  # its official shape: no download needed
        lm = load(f"random:{known.shape}", device="meta")
        return Described(known.hub_id, lm.model, lm.config, known)
    if folder.is_dir():
        config_file = folder / "config.json"
    elif is_hub_id(name):
        config_file = download_file(name, "config.json")
    else:
        raise ModelLoadError(f"{name}: not a model folder, a hub id ORG/NAME[@REVISION] or random:SHAPE")
    config = load_config(config_file)
    with torch.device("meta"):
        model = get_family(config.family).model_class(config)
    return Described(name, model, config, identify(config_file.parent, config.raw))


def model_memory(
    lm, dtype: torch.dtype, length: int, quantize: str | None = None, quantize_head: bool = False
) -> dict:
    """Weights and per-request cache memory of a (meta) model in `dtype`, its layers' linear
    layers quantized with `quantize` (models/quantize.py) when given."""
    from .device import resolve_device
    from .quantize import QUANTIZATIONS, expected_weights_bytes

    if length < 1:
        raise InputError(f"--length must be a positive number of positions, got {length}")
    total, active = parameter_counts(lm)
    weights = total * DTYPE_BYTES[dtype]
    if quantize is not None or quantize_head:
        weights = expected_weights_bytes(lm.model, dtype, quantize, quantize_head)
    return {
        "model": lm.name,
        "family": lm.config.family,
        "dtype": str(dtype).removeprefix("torch."),
        "quantization": quantize,
        "quantized_head": quantize_head,
        "head_quantization": QUANTIZATIONS[quantize].for_head(resolve_device(None).type).name
        if quantize in QUANTIZATIONS and quantize_head
        else None,
        "parameters_total": total,
        "parameters_active": active,
        "weights_bytes": weights,
        "length": length,
        "context": lm.config.max_length,
        "cache_bytes_per_request": cache_bytes(lm.config, length, dtype),
    }
