"""LLaDA2.0 / LLaDA2.1 (inclusionAI, ``LLaDA2MoeModelLM``, model_type ``llada2_moe``): a
block-diffusion transformer with grouped-query attention (one fused q/k/v projection,
QK-norm, RoPE on part of each head), a dense first layer then mixture-of-experts layers
(models/moe.py: sigmoid scores, an expert bias, group-limited top-k, a shared expert).

Module names mirror the official checkpoint: model.word_embeddings,
model.layers.{i}.{input_layernorm, attention.{query_key_value, query_layernorm,
key_layernorm, dense}, post_attention_layernorm, mlp.*}, model.norm, lm_head.
"""

from __future__ import annotations

import torch
from torch import nn

from .block_configs import read_llada2_fields
from .config import Family, ModelConfig
from .decoder import DecoderLM, PreNormLayer, head_norm
from .layers import Context, RMSNorm


class LLaDA2Attention(nn.Module):
    """Fused query_key_value [(heads + 2 kv_heads) * head_dim, hidden] -> q | k | v."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        hd = config.head_dim
        self.head_dim = hd
        self.sizes = (config.n_heads * hd, config.n_kv_heads * hd, config.n_kv_heads * hd)
        self.query_key_value = nn.Linear(config.hidden_size, sum(self.sizes), bias=config.qkv_bias)
        if config.qk_norm:
            self.query_layernorm = RMSNorm(hd, config.rms_norm_eps)
            self.key_layernorm = RMSNorm(hd, config.rms_norm_eps)
        self.dense = nn.Linear(config.n_heads * hd, config.hidden_size, bias=False)
        self.qk_norm = config.qk_norm

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        q, k, v = self.query_key_value(x).split(self.sizes, dim=-1)
        if self.qk_norm:
            q, k = (
                head_norm(q, self.query_layernorm, self.head_dim),
                head_norm(k, self.key_layernorm, self.head_dim),
            )
        # cos/sin reach the model dtype before rotating, as in the official rotary embedding
        return self.dense(ctx.attend(layer, q, k, v, self.head_dim, rope_fp32=False))


class LLaDA2Layer(PreNormLayer):
    attention_name = "attention"


class LLaDA2Model(DecoderLM):
    """LLaDA2's decoder: logits at position i predict token i (no shift)."""

    embedding_name = "word_embeddings"

    def __init__(self, config: ModelConfig):
        super().__init__(
            config, [LLaDA2Layer(config, i, LLaDA2Attention(config)) for i in range(config.n_layers)]
        )


# No confidence gating (the family's own decoders are threshold decoders); its cache is exact.
LLADA2 = Family(
    name="llada2",
    architectures=("LLaDA2MoeModelLM",),
    model_types=("llada2_moe",),
    read_fields=read_llada2_fields,
    model_class=LLaDA2Model,
    confidence_gating=False,
    cache_refresh_every=16,
    description="LLaDA2.0 / LLaDA2.1 (inclusionAI): block-diffusion MoE transformer, blocks of 32",
    block_causal=True,
)
