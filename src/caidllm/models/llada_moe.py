"""LLaDA-MoE (inclusionAI, LLaDA-MoE-7B-A1B-Base / -Instruct): LLaDA's masked diffusion on an
OLMoE-shaped transformer: RMSNorm over each head of q and k before RoPE, and a
mixture-of-experts feed-forward layer (models/moe.py: softmax over 64 experts, top 8,
weights not renormalised) in every layer that config.json's moe_layer_freq marks (a dense
SwiGLU of dense_intermediate_size in the others). Logits are not shifted (as LLaDA's).

Module names mirror the official checkpoint (OLMoE layout): model.{embed_tokens,
layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
post_attention_layernorm, mlp.gate, mlp.experts.{e}.{gate,up,down}_proj}, norm}, lm_head.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ModelLoadError
from .config import ConfigFields, Family, ModelConfig
from .layers import Context, RMSNorm, logits_at_targets
from .moe import ExpertMLP, MoEConfig, MoEFeedForward


class LLaDAMoEAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.head_dim = hd
        self.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * hd, d, bias=cfg.qkv_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)  # one weight shared by every head
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        R, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(R, n, -1, self.head_dim)).view(R, n, -1)
        k = self.k_norm(self.k_proj(x).view(R, n, -1, self.head_dim)).view(R, n, -1)
        # The official rotary tables are cast to the model dtype before use (rope_fp32=False).
        return self.o_proj(ctx.attend(layer, q, k, self.v_proj(x), self.head_dim, rope_fp32=False))


class LLaDAMoELayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LLaDAMoEAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if index >= cfg.dense_layers:
            self.mlp = MoEFeedForward(cfg.moe)
        else:
            self.mlp = ExpertMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LLaDAMoEModel(nn.Module):
    """Maps token ids of the computed positions to logits (no shift)."""

    extra_left = 0

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(LLaDAMoELayer(cfg, i) for i in range(cfg.n_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, ctx: Context | None = None):
        """As LLaDAModel.forward: float32 logits [R, block, V] for ``ctx.targets``."""
        m = self.model
        if ctx is None:
            ctx = Context.whole_canvas(ids, self.cfg.head_dim, self.cfg.rope_theta)
        x = m.embed_tokens(ids)
        for i, layer in enumerate(m.layers):
            x = layer(ctx.enter(i, x), ctx, i)
        x = ctx.leave(len(m.layers), x)
        head = m.embed_tokens.weight if self.cfg.tie_embeddings else self.lm_head.weight
        return logits_at_targets(ctx, x, m.norm, head)


# ---- config.json -------------------------------------------------------------

# Settings of the official configuration that the released checkpoints leave at these values
# and this implementation does not model otherwise (None = absent).
LLADA_MOE_SUPPORTED_SETTINGS = {
    "hidden_act": ("silu", None),
    "moe_router_score_function": ("softmax", None),
    "moe_router_enable_expert_bias": (False, None),  # the official code adds it to the weights too
    "shared_expert_intermediate_size": (None,),
    "router_num_group": (None, 1),
    "routed_scaling_factor": (1, 1.0, None),
    "norm_topk_prob": (False, None),  # the official block never renormalises the top-k weights
    "clip_qkv": (None,),
    "rope_scaling": (None,),
    "partial_rotary_factor": (1, 1.0, None),
    "qk_layernorm": (True, None),
}


def read_llada_moe_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """The ModelConfig fields of a LLaDA-MoE config.json (Hugging Face / OLMoE field names)."""
    from .llada import check_settings

    check_settings(raw, source, LLADA_MOE_SUPPORTED_SETTINGS, "LLaDA-MoE")
    n_layers, hidden = get.int("num_hidden_layers"), get.int("hidden_size")
    n_heads = get.int("num_attention_heads")
    freq = raw.get("moe_layer_freq")
    if freq is None:
        freq = [1] * n_layers
    if not (isinstance(freq, list) and len(freq) == n_layers and all(f in (0, 1) for f in freq)):
        raise ModelLoadError(f"{source}: field 'moe_layer_freq' = {freq!r} must list 0 (dense) or 1 (MoE) "
                             f"for each of the {n_layers} layers")
    dense_layers = freq.index(1) if 1 in freq else n_layers
    if any(f == 0 for f in freq[dense_layers:]):  # the released checkpoints are MoE in every layer
        raise ModelLoadError(f"{source}: field 'moe_layer_freq' = {freq!r}: caidllm runs dense layers first, then "
                             "MoE ones (a dense layer after an MoE one is not supported)")
    moe = MoEConfig(hidden_size=hidden, moe_intermediate_size=get.int("expert_intermediate_size"),
                    num_experts=get.int("num_experts"), num_experts_per_tok=get.int("num_experts_per_tok"),
                    score_function="softmax", norm_topk_prob=False,
                    router_fp32=False)  # the official gate runs in the model dtype, its softmax in fp32
    # The dense layers' width: required only when some layer is dense (the released checkpoints have none).
    dense_width = get.int("dense_intermediate_size") if dense_layers else get.int("dense_intermediate_size", 0)
    return dict(
        vocab_size=get.int("vocab_size"),
        hidden_size=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=get.int("num_key_value_heads", None) or n_heads,
        intermediate_size=dense_width,
        rope_theta=get.float("rope_theta", 10000.0),
        rms_norm_eps=get.float("rms_norm_eps", 1e-5),
        max_length=get.int("max_position_embeddings"),
        qkv_bias=get.bool("attention_bias", False),
        tie_embeddings=get.bool("tie_word_embeddings", False),
        moe=moe,
        dense_layers=dense_layers,
        qk_norm=True,
    )


# LLaDA's decoding (the official generate is LLaDA's): confidence gating on, refresh every 16 steps.
LLADA_MOE = Family(
    # The official config.json says model_type "llada": its architectures tell it from LLaDA's.
    name="llada_moe", architectures=("LLaDAMoEModelLM",), model_types=("lladamoe", "llada_moe", "llada"),
    read_fields=read_llada_moe_fields, model_class=LLaDAMoEModel, confidence_gating=True, cache_refresh_every=16,
    description="LLaDA-MoE (inclusionAI): OLMoE-shaped, QK-norm, 64 experts top-8 (models/moe.py)",
)
