"""config.json of DiffusionGemma (``DiffusionGemmaForBlockDiffusion``, model_type ``diffusion_gemma``),
read into ModelConfig fields and the family's own shape (DGShape): the text config's per-layer
attention types (sliding-window and full layers interleaved), the full layers' own head size and
key/value heads, RoPE per layer type, the logit soft-cap, the routed experts beside the dense MLP,
and the canvas length.

Official field names and defaults are those of transformers' DiffusionGemmaTextConfig /
DiffusionGemmaConfig (5.25). The full layers' sizes come from ``per_layer_config`` where the file
has it (transformers writes it), else from ``global_head_dim`` (default 512) and
``num_global_key_value_heads`` (the released checkpoint's config.json names both).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelLoadError
from .config import ConfigFields, check_heads
from .moe import MoEConfig

SLIDING, FULL = "sliding_attention", "full_attention"
# generation_config.json of google/diffusiongemma-26B-A4B-it (the sampler's defaults, decode/ reads them)
GENERATION_DEFAULTS = {
    "max_denoising_steps": 48,
    "entropy_bound": 0.1,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
}
DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
IMAGE_TOKEN_ID = 258_880  # DiffusionGemmaConfig.image_token_id's default


@dataclass(frozen=True)
class Rope:
    """One layer type's rotary embedding: ``default`` (every pair of the head rotated) or
    ``proportional`` (the first partial_rotary_factor of the pairs rotated, frequencies over the
    whole head; the other pairs pass unrotated)."""

    kind: str
    theta: float
    partial: float = 1.0


@dataclass(frozen=True)
class DGShape:
    layer_types: tuple[str, ...]
    sliding_window: int
    full_head_dim: int
    full_kv_heads: int
    rope: dict  # layer type -> Rope
    softcap: float | None
    canvas_length: int
    image_token_id: int | None

    def head_dim(self, layer: int, config) -> int:
        return self.full_head_dim if self.layer_types[layer] == FULL else config.head_dim

    def kv_heads(self, layer: int, config) -> int:
        return self.full_kv_heads if self.layer_types[layer] == FULL else config.n_kv_heads


def text_config(raw: dict, source: str) -> dict:
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ModelLoadError(f"{source}: a diffusion_gemma config.json needs a 'text_config' object")
    return text


def read_diffusion_gemma_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """ModelConfig fields of the text model (the vision tower is not read: text only)."""
    text = text_config(raw, source)
    t = ConfigFields(text, f"{source} text_config")
    if text.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelLoadError(
            f"{source}: text_config hidden_activation={text.get('hidden_activation')!r} "
            "(only 'gelu_pytorch_tanh' is supported)"
        )
    if text.get("use_bidirectional_attention") == "all":
        raise ModelLoadError(
            f"{source}: text_config use_bidirectional_attention='all' (a bidirectional encoder) "
            "is not supported; the released model's encoder is causal over text"
        )
    if t.bool("attention_bias", False):
        raise ModelLoadError(f"{source}: text_config attention_bias=true is not supported")
    d, h = t.int("hidden_size"), t.int("num_attention_heads")
    kv, head_dim = t.int("num_key_value_heads"), t.int("head_dim")
    check_heads(h, kv, head_dim, f"{source} text_config")
    dg_shape(raw, source)  # the per-layer fields checked now, not at the first forward
    moe = MoEConfig(
        hidden_size=d,
        moe_intermediate_size=t.int("moe_intermediate_size"),
        num_experts=t.int("num_experts"),
        num_experts_per_tok=t.int("top_k_experts"),
        score_function="softmax",
        norm_topk_prob=True,
        router_fp32=False,
    )
    canvas = ConfigFields(raw, source).int("canvas_length", 256)
    return dict(
        vocab_size=t.int("vocab_size"),
        hidden_size=d,
        n_layers=t.int("num_hidden_layers"),
        n_heads=h,
        n_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=t.int("intermediate_size"),
        rope_theta=10_000.0,
        rms_norm_eps=t.float("rms_norm_eps", 1e-6),
        max_length=t.int("max_position_embeddings", 131_072),
        qkv_bias=False,
        tie_embeddings=get.bool("tie_word_embeddings", True),
        eos_id=t.int("eos_token_id", 1),
        mask_id=None,
        block_causal=True,
        block_lengths=(canvas,),
        qk_norm=True,
        moe=moe,
    )


def dg_shape(raw: dict, source: str = "config.json") -> DGShape:
    text = text_config(raw, source)
    t = ConfigFields(text, f"{source} text_config")
    n_layers = t.int("num_hidden_layers")
    layer_types = _layer_types(text.get("layer_types"), n_layers, source)
    full_head_dim, full_kv = t.int("global_head_dim", 512), t.int("num_global_key_value_heads", None)
    per_layer = text.get("per_layer_config") or {}
    for index, overrides in per_layer.items():
        if layer_types[int(index)] == FULL and isinstance(overrides, dict):
            full_head_dim = overrides.get("head_dim", full_head_dim)
            full_kv = overrides.get("num_key_value_heads", full_kv)
    full_kv = full_kv or t.int("num_key_value_heads")
    check_heads(t.int("num_attention_heads"), full_kv, full_head_dim, f"{source} text_config (full layers)")
    rope = {
        kind: _rope(text.get("rope_parameters") or DEFAULT_ROPE, kind, source) for kind in (SLIDING, FULL)
    }
    window = t.int("sliding_window", 512)
    if window < 2:
        raise ModelLoadError(f"{source}: text_config sliding_window={window} must be at least 2")
    canvas = ConfigFields(raw, source).int("canvas_length", 256)
    if canvas < 1:
        raise ModelLoadError(f"{source}: canvas_length={canvas} must be positive")
    softcap = text.get("final_logit_softcapping", 30.0)
    return DGShape(
        layer_types=layer_types,
        sliding_window=window,
        full_head_dim=int(full_head_dim),
        full_kv_heads=int(full_kv),
        rope=rope,
        softcap=None if softcap is None else float(softcap),
        canvas_length=canvas,
        image_token_id=raw.get("image_token_id", IMAGE_TOKEN_ID),
    )


def _layer_types(value, n_layers: int, source: str) -> tuple[str, ...]:
    if value is None:  # the configuration class's default: five sliding layers, then a full one
        value = [SLIDING if (i + 1) % 6 else FULL for i in range(n_layers)]
    if not isinstance(value, list) or len(value) != n_layers or not set(value) <= {SLIDING, FULL}:
        raise ModelLoadError(
            f"{source}: text_config layer_types must list {n_layers} entries of "
            f"{SLIDING!r} / {FULL!r}, got {value!r}"
        )
    value = list(value)
    value[-1] = FULL  # the configuration class forces the last layer to full attention
    return tuple(value)


def _rope(parameters: dict, kind: str, source: str) -> Rope:
    p = parameters.get(kind) if isinstance(parameters, dict) else None
    if not isinstance(p, dict):
        raise ModelLoadError(f"{source}: text_config rope_parameters has no {kind!r} entry")
    rope_type, partial = p.get("rope_type", "default"), float(p.get("partial_rotary_factor", 1.0))
    if (
        rope_type not in ("default", "proportional")
        or (rope_type == "default" and partial != 1.0)
        or p.get("factor", 1.0) != 1.0
    ):
        raise ModelLoadError(
            f"{source}: unsupported rope_parameters[{kind!r}] = {p!r} (default RoPE on the "
            "whole head, or proportional RoPE without a factor)"
        )
    return Rope(kind=rope_type, theta=float(p.get("rope_theta", 10_000.0)), partial=partial)


# google/diffusiongemma-26B-A4B-it's config.json, its text part (the vision tower is not built): the field
# values as a public mirror of the released file gives them (dotLLM's test fixture "verified real-26B
# config", transcribed from the model's config.json; richengine's Gemma4MoeLayout agrees on every size).
RELEASED_26B_A4B = {
    "architectures": ["DiffusionGemmaForBlockDiffusion"],
    "model_type": "diffusion_gemma",
    "canvas_length": 256,
    "dtype": "bfloat16",
    "tie_word_embeddings": True,
    "use_bidirectional_attention": "vision",
    "image_token_id": IMAGE_TOKEN_ID,
    "text_config": {
        "model_type": "diffusion_gemma_text",
        "hidden_size": 2816,
        "num_hidden_layers": 30,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "num_global_key_value_heads": 2,
        "head_dim": 256,
        "global_head_dim": 512,
        "intermediate_size": 2112,
        "moe_intermediate_size": 704,
        "num_experts": 128,
        "top_k_experts": 8,
        "vocab_size": 262144,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0,
        "sliding_window": 1024,
        "layer_types": ([SLIDING] * 5 + [FULL]) * 5,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            FULL: {"rope_theta": 1_000_000.0, "partial_rotary_factor": 0.25, "rope_type": "proportional"},
            SLIDING: {"rope_theta": 10_000.0, "rope_type": "default"},
        },
        "eos_token_id": 1,
        "pad_token_id": 0,
        "bos_token_id": 2,
    },
}


def with_overrides(raw: dict, overrides: dict) -> dict:
    """A random shape's config.json with `overrides` applied: text_config's fields (num_hidden_layers shortens
    layer_types, keeping its pattern and a full last layer) or the top level's (canvas_length)."""
    text = raw["text_config"]
    for key, value in overrides.items():
        (text if key in text else raw)[key] = value
    n = text["num_hidden_layers"]
    if len(text["layer_types"]) != n:
        pattern = RELEASED_26B_A4B["text_config"]["layer_types"]
        text["layer_types"] = [pattern[i % len(pattern)] for i in range(n - 1)] + [FULL]
    return raw


def dg_tp_sizes(config) -> list[tuple[str, int]]:
    """What --tp must divide beyond the heads and experts every family's check reads (models/plan.py): the
    full-attention layers' key/value heads and the dense MLP's width beside the experts."""
    return [
        ("key/value heads of the full-attention layers", dg_shape(config.raw).full_kv_heads),
        ("dense MLP width (intermediate_size)", config.intermediate_size),
    ]
