"""Fast-dLLM v2 (NVlabs, ``Fast_dLLM_QwenForCausalLM``, model_type ``Fast_dLLM_Qwen``): Qwen2.5
fine-tuned into a block-diffusion model. Its layout is Qwen2.5's (grouped-query attention with
q/k/v biases, RoPE on whole heads, SwiGLU, untied or tied head), its attention block-causal at
inference (the modeling file's ``eval_mask``: a query of block b sees the keys of blocks <= b; the
complementary mask is the training one, a noisy copy and a clean copy of the sequence), and it
keeps the autoregressive token shift (the hidden state at i - 1 predicts the token at i), undone
here as Dream's is: callers see logits aligned to positions.

Module names mirror the official checkpoint (Qwen2 layout), so they are Dream's:
model.{embed_tokens, layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}, norm}, lm_head.

The within-block cache's forward ("subblock", models/modes/subblock.py) computes only a sub-block
of the current block; there, as in the official generator (``logits = cat(logits[:, :1],
logits[:, :-1])`` over the sub-block's logits), each position reads the hidden state of the one
before it among the computed positions, and the sub-block's first its own (it is never masked
when this forward runs: the official loop runs it only once that position is decoded).
"""

from __future__ import annotations

import torch

from .block_configs import read_fastdllm_v2_fields
from .config import Family
from .dream import DreamModel
from .layers import Context


class FastDLLMv2Model(DreamModel):
    """Dream's Qwen2 decoder with block-causal attention (the config's block_causal)."""

    def head_sources(self, ctx: Context, x: torch.Tensor) -> torch.Tensor:
        if not ctx.shift_within_computed:  # the sub-block forward sets it (models/modes/subblock.py)
            return super().head_sources(ctx, x)
        n = x.shape[1]
        within = (torch.arange(n, device=x.device) - 1).clamp(min=0)  # [0, 0, 1, ..., n - 2]
        return within.expand(x.shape[0], -1)


# No confidence gating (its own decoder is a threshold decoder); its block cache is exact.
FASTDLLM_V2 = Family(
    name="fastdllm_v2",
    architectures=("Fast_dLLM_QwenForCausalLM",),
    model_types=("fast_dllm_qwen",),
    read_fields=read_fastdllm_v2_fields,
    model_class=FastDLLMv2Model,
    confidence_gating=False,
    cache_refresh_every=16,
    description="Fast-dLLM v2 (NVlabs): Qwen2.5 made block-diffusion, blocks of 32, shifted logits",
    block_causal=True,
)
