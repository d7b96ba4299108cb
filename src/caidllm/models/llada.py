"""LLaDA (GSAI-ML): a LLaMA-shaped bidirectional transformer.

Module names mirror the official checkpoint, so its safetensors load as is:
model.transformer.{wte, blocks.{i}.*, ln_f, ff_out}.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ModelLoadError
from .config import ConfigFields, Family, ModelConfig
from .layers import Context, RMSNorm, default_attention_block, logits_at_targets, swiglu, swiglu_weights


class LLaDABlock(nn.Module):
    mlp_kernel = staticmethod(swiglu_weights)  # models/compiled.py may swap in a compiled one

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, kv, hd = cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim, cfg.head_dim
        self.head_dim = hd
        self.attn_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, kv, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, kv, bias=cfg.qkv_bias)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.ff_proj = nn.Linear(d, cfg.intermediate_size, bias=False)  # SiLU gate
        self.up_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.ff_out = nn.Linear(cfg.intermediate_size, d, bias=False)  # down projection

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        h = self.attn_norm(x)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        x = x + self.attn_out(ctx.attend(layer, q, k, v, self.head_dim, rope_fp32=True))
        return x + swiglu(self.ff_norm(x), self.ff_proj, self.up_proj, self.ff_out, self.mlp_kernel)


class LLaDAModel(nn.Module):
    """Maps token ids of the computed positions to logits (no shift)."""

    extra_left = 0  # positions left of the block needed to predict it

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        t = nn.Module()
        t.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        t.blocks = nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers))
        t.ln_f = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_embeddings:
            t.ff_out = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.model = nn.Module()
        self.model.transformer = t

    def forward(self, ids: torch.Tensor, ctx: Context | None = None):
        """ids: [R, n] tokens of the computed positions. Returns float32 logits
        [R, block, V] for the columns ``ctx.targets`` (all computed positions
        when it is None). Without ctx: the whole canvas, no padding, no cache."""
        t = self.model.transformer
        if ctx is None:
            ctx = Context.whole_canvas(
                ids, self.cfg.head_dim, self.cfg.rope_theta, default_attention_block(self.cfg)
            )

        x = t.wte(ids)
        for i, block in enumerate(t.blocks):
            x = block(ctx.enter(i, x), ctx, i)  # es mode: fewer positions at deeper layers
        x = ctx.leave(len(t.blocks), x)  # back to every computed position

        head = t.wte.weight if self.cfg.tie_embeddings else t.ff_out.weight
        return logits_at_targets(ctx, x, t.ln_f, head)


# ---- config.json -------------------------------------------------------------

# Settings of the LLaDA (OLMo-style) config.json that this implementation does not
# model, with the values it does: anything else is refused rather than computed differently.
LLADA_SUPPORTED_SETTINGS = {
    "block_type": ("llama", None),
    "activation_type": ("silu", "swiglu", None),
    "layer_norm_type": ("rms", None),
    "rope": (True, None),
    "alibi": (False, None),
    "attention_layer_norm": (False, None),
    "input_emb_norm": (False, None),
    "scale_logits": (False, None),
}


def read_llada_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """The ModelConfig sizes of a LLaDA config.json (OLMo field names)."""
    check_settings(raw, source, LLADA_SUPPORTED_SETTINGS, "LLaDA")
    n_heads = get.int("n_heads")
    return dict(
        # The weights are sized by embedding_size when it is set (it pads vocab_size).
        vocab_size=get.int("embedding_size", None) or get.int("vocab_size"),
        hidden_size=get.int("d_model"),
        n_layers=get.int("n_layers"),
        n_heads=n_heads,
        n_kv_heads=get.int("n_kv_heads", None) or n_heads,
        intermediate_size=get.int("mlp_hidden_size"),
        rope_theta=get.float("rope_theta", 10000.0),
        rms_norm_eps=get.float("rms_norm_eps", 1e-5),
        max_length=get.int("max_sequence_length"),
        qkv_bias=bool(raw.get("include_qkv_bias") or raw.get("include_bias")),
        tie_embeddings=bool(raw.get("weight_tying", False)),
    )


def check_settings(raw: dict, source: str, supported: dict, family: str) -> None:
    """Refuse a config.json setting outside `supported` (key -> allowed values, None = absent)."""
    for key, allowed in supported.items():
        if raw.get(key) not in allowed:
            wanted = " or ".join(repr(a) for a in allowed if a is not None)
            raise ModelLoadError(
                f"{source}: unsupported {family} setting {key}={raw.get(key)!r} (expected {wanted})"
            )


# Confidence gating on, cache refresh every 16 steps (DESIGN.md).
LLADA = Family(
    # MMaDA-8B (Gen-Verse) is LLaDA's layout with a larger vocabulary (image codes): its text path runs here.
    name="llada",
    architectures=("LLaDAModelLM", "MMadaModelLM"),
    model_types=("llada", "mmada"),
    read_fields=read_llada_fields,
    model_class=LLaDAModel,
    confidence_gating=True,
    cache_refresh_every=16,
    description="LLaDA (GSAI-ML): LLaMA-shaped bidirectional transformer, OLMo-style config.json",
)
