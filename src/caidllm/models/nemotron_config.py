"""Nemotron-Labs-Diffusion's config.json (NVIDIA, ``NemotronLabsDiffusionModel``, model_type
``nemotron_labs_diffusion``): the hub repository's ``configuration_nemotron_labs_diffusion.py`` over a
Ministral-3 backbone (``modeling_ministral.py``): Mistral's dense layout (grouped-query attention, no
biases, SwiGLU, untied head named ``diffusion_head``), YaRN RoPE and Llama-4's query scaling by position
(``rope_parameters``), a mask token for the diffusion modes.

The official shapes (``random:`` models) are the released config.json fields as the stored copies give
them (docs/nemotron.md names each source): 3B and 14B in full, 8B from the configuration class's
defaults, which are Ministral-3-8B's and agree with every stored copy of the 8B config that lists them.
"""

from __future__ import annotations

import math

import torch

from ..errors import ModelLoadError
from .config import ConfigFields, check_heads

# config.json fields of the official checkpoints (the -Base checkpoints have the same shapes)
_COMMON = {
    "architectures": ["NemotronLabsDiffusionModel"],
    "model_type": "nemotron_labs_diffusion",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "block_size": 32,
    "dlm_paradigm": "bidirectional",
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 131072,
}


def _rope(theta: float) -> dict:
    return {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": 16.0,
        "original_max_position_embeddings": 16384,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    }


NEMOTRON_OFFICIAL = {
    "nemotron-labs-diffusion-3b": {
        **_COMMON,
        "hidden_size": 3072,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "rope_parameters": _rope(1000000.0),
    },
    "nemotron-labs-diffusion-8b": {
        **_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 34,
        "rope_parameters": _rope(1000000.0),
    },
    "nemotron-labs-diffusion-14b": {
        **_COMMON,
        "hidden_size": 5120,
        "intermediate_size": 16384,
        "num_hidden_layers": 40,
        "rope_parameters": _rope(1000000000.0),
    },
}
# the checkpoints' own token ids (config.json mask_token_id, eos_token_id; bos 1 as Mistral's)
NEMOTRON_IDS = {"mask": 100, "eos": 11}


def read_nemotron_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """The ModelConfig fields of a Nemotron-Labs-Diffusion config.json; what the official forward does not
    model (a sliding window, biases, another RoPE type, another activation) is refused, naming the field."""
    for key, allowed in (
        ("hidden_act", ("silu", None)),
        ("attention_bias", (False, None)),
        ("mlp_bias", (False, None)),
        ("sliding_window", (None,)),
    ):
        if raw.get(key) not in allowed:
            raise ModelLoadError(
                f"{source}: unsupported Nemotron-Labs-Diffusion setting {key}={raw.get(key)!r}"
            )
    rope = rope_parameters(raw, source)
    d, h = get.int("hidden_size"), get.int("num_attention_heads")
    kv = get.int("num_key_value_heads", None) or h
    head_dim = get.int("head_dim", None) or d // h
    check_heads(h, kv, head_dim, source)
    eos = get.int("eos_token_id", None)
    return dict(
        vocab_size=get.int("vocab_size"),
        hidden_size=d,
        n_layers=get.int("num_hidden_layers"),
        n_heads=h,
        n_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=get.int("intermediate_size"),
        rope_theta=float(rope["rope_theta"]),
        rms_norm_eps=get.float("rms_norm_eps", 1e-5),
        max_length=get.int("max_position_embeddings"),
        qkv_bias=False,
        tie_embeddings=get.bool("tie_word_embeddings", False),
        mask_id=get.int("mask_token_id", NEMOTRON_IDS["mask"]),
        eos_id=NEMOTRON_IDS["eos"] if eos is None else eos,
    )


def rope_parameters(raw: dict, source: str) -> dict:
    """rope_parameters (transformers 5; rope_scaling in earlier files), checked: YaRN or plain RoPE."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ModelLoadError(f"{source}: field 'rope_parameters' = {rope!r} must be an object")
    rope = {"rope_type": "default", "rope_theta": raw.get("rope_theta", 1000000.0), **rope}
    if rope["rope_type"] not in ("yarn", "default"):
        raise ModelLoadError(
            f"{source}: unsupported rope_parameters.rope_type {rope['rope_type']!r} "
            "(expected 'yarn' or 'default')"
        )
    for key in ("rope_theta", "factor", "original_max_position_embeddings", "llama_4_scaling_beta"):
        value = rope.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            raise ModelLoadError(f"{source}: rope_parameters.{key} = {value!r} must be a positive number")
    if rope["rope_type"] == "yarn" and (
        rope.get("factor") is None or rope.get("original_max_position_embeddings") is None
    ):
        raise ModelLoadError(
            f"{source}: YaRN rope_parameters need 'factor' and 'original_max_position_embeddings'"
        )
    return rope


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inverse_frequencies(rope: dict, head_dim: int, device) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim / 2] float32, the factor cos / sin are scaled by): transformers' YaRN (the
    ramp between interpolated and extrapolated frequencies over the correction range of beta_fast /
    beta_slow, attention factor from mscale / mscale_all_dim), or plain RoPE."""
    base = float(rope["rope_theta"])
    pos_freqs = base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    if rope["rope_type"] != "yarn":
        return 1.0 / pos_freqs, 1.0
    factor, original = float(rope["factor"]), float(rope["original_max_position_embeddings"])
    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
    attention = rope.get("attention_factor")
    if attention is None:
        attention = (
            yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
            if mscale and mscale_all
            else yarn_mscale(factor)
        )

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.get("beta_fast") or 32), correction_dim(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, device=device, dtype=torch.float32) - low) / (high - low)).clamp(
        0, 1
    )
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention)
