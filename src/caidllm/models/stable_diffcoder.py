"""Stable-DiffCoder (ByteDance Seed, ``StableDiffcoderForCausalLM``): Seed-Coder-8B's Llama layout trained
by block-diffusion continual pretraining. Its modeling file subclasses transformers' LlamaForCausalLM and
adds only a generate: the forward is Llama's (grouped-query attention without biases or QK-norm,
rotate-half RoPE on whole heads, SwiGLU, untied head), run under the block-causal mask it builds from
position 0 over prompt and answer (blocks of 4), its logits unshifted (``shift=False``).

Module names mirror the checkpoint (Llama layout): model.embed_tokens, model.layers.{i}.{input_layernorm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head.
"""

from __future__ import annotations

import torch
from torch import nn

from .block_configs import read_stable_diffcoder_fields
from .config import Family, ModelConfig
from .decoder import DecoderLM, PreNormLayer
from .layers import Context


class LlamaAttention(nn.Module):
    """Llama's attention: q/k/v/o projections (biases only when config.json's attention_bias asks)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.head_dim = hd
        self.q_proj = nn.Linear(d, config.n_heads * hd, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.n_heads * hd, d, bias=config.qkv_bias)

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        # transformers' Llama casts its fp32 rotary tables to the activations' dtype, as rope_fp32=False does.
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(ctx.attend(layer, q, k, v, self.head_dim, rope_fp32=False))


class StableDiffCoderModel(DecoderLM):
    """Llama's decoder, block-causal (the config's block_causal): logits at i predict token i."""

    def __init__(self, config: ModelConfig):
        super().__init__(
            config, [PreNormLayer(config, i, LlamaAttention(config)) for i in range(config.n_layers)]
        )


# No confidence gating (its own decoder is a fixed-quota low-confidence one); its block cache is exact. No
# model_type: config.json says "llama", which an autoregressive Llama says too. SeedDiffcoderForCausalLM: the
# first revisions' class (the same LlamaForCausalLM forward), named only in their auto_map.
STABLE_DIFFCODER = Family(
    name="stable_diffcoder",
    architectures=("StableDiffcoderForCausalLM", "SeedDiffcoderForCausalLM"),
    model_types=(),
    read_fields=read_stable_diffcoder_fields,
    model_class=StableDiffCoderModel,
    confidence_gating=False,
    cache_refresh_every=16,
    description="Stable-DiffCoder (ByteDance Seed): Seed-Coder's Llama layout, block-diffusion, blocks of 4",
    block_causal=True,
)
