"""SDAR (JetAstra, ``SDARForCausalLM`` / ``SDARMoeForCausalLM``): Qwen3's layout made
block-diffusion: grouped-query attention with QK-norm, no biases, RoPE on whole heads,
block-causal attention; SDAR-30B-A3B replaces every feed-forward with Qwen3-MoE's experts
(softmax scores, top-8 of 128, normalised weights; models/moe.py).

Module names mirror the official checkpoint (Qwen3 layout): model.embed_tokens,
model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
post_attention_layernorm, mlp.*}, model.norm, lm_head.
"""

from __future__ import annotations

import torch
from torch import nn

from .block_configs import read_sdar_fields
from .config import Family, ModelConfig
from .decoder import DecoderLM, PreNormLayer, head_norm
from .layers import Context, RMSNorm


class SDARAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.head_dim = hd
        self.q_proj = nn.Linear(d, config.n_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.n_heads * hd, d, bias=config.qkv_bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        q = head_norm(self.q_proj(x), self.q_norm, self.head_dim)
        k = head_norm(self.k_proj(x), self.k_norm, self.head_dim)
        return self.o_proj(ctx.attend(layer, q, k, self.v_proj(x), self.head_dim, rope_fp32=False))


class SDARModel(DecoderLM):
    """SDAR's decoder (dense or MoE): logits at position i predict token i (no shift)."""

    def __init__(self, config: ModelConfig):
        super().__init__(
            config, [PreNormLayer(config, i, SDARAttention(config)) for i in range(config.n_layers)]
        )


# No confidence gating (the family's own decoders are threshold decoders); its cache is exact.
SDAR = Family(
    name="sdar",
    architectures=("SDARForCausalLM", "SDARMoeForCausalLM"),
    model_types=("sdar", "sdar_moe"),
    read_fields=read_sdar_fields,
    model_class=SDARModel,
    confidence_gating=False,
    cache_refresh_every=16,
    description="SDAR (JetAstra): Qwen3-layout block-diffusion transformer (dense or MoE), blocks of 4",
    block_causal=True,
)
