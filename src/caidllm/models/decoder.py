"""The decoder stack the Hugging Face-style families share (LLaDA2, SDAR): pre-norm layers
of attention then a feed-forward (dense SwiGLU, or mixture-of-experts from
``config.dense_layers`` on), a final RMSNorm and an untied or tied LM head.

Each family names its attention module and embedding differently; its model file
subclasses these with the official names and keeps the forward here.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .layers import Context, RMSNorm, default_attention_block, logits_at_targets
from .moe import ExpertMLP, MoEFeedForward


def head_norm(x: torch.Tensor, norm: RMSNorm, head_dim: int) -> torch.Tensor:
    """RMSNorm over each head of x [R, n, heads*head_dim] (QK-norm)."""
    return norm(x.view(*x.shape[:-1], -1, head_dim)).view(x.shape)


def feed_forward(config: ModelConfig, layer: int) -> nn.Module:
    """Layer `layer`'s feed-forward: mixture-of-experts from config.dense_layers on, else dense."""
    if config.moe is not None and layer >= config.dense_layers:
        return MoEFeedForward(config.moe)
    return ExpertMLP(config.hidden_size, config.intermediate_size)


class PreNormLayer(nn.Module):
    """x + attention(norm(x)), then + mlp(norm(x)); the attention module's attribute name is
    the family's (``attention_name``)."""

    attention_name = "self_attn"

    def __init__(self, config: ModelConfig, layer: int, attention: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        setattr(self, self.attention_name, attention)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = feed_forward(config, layer)

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        x = x + getattr(self, self.attention_name)(self.input_layernorm(x), ctx, layer)
        h = self.post_attention_layernorm(x)
        # a block-routed MoE (LLaDA2.2) reads each position's block from the context
        return x + (self.mlp(h, ctx) if isinstance(self.mlp, MoEFeedForward) else self.mlp(h))


class DecoderLM(nn.Module):
    """Maps token ids of the computed positions to logits (no shift): model.{<embedding>,
    layers, norm} and lm_head. Subclasses set ``embedding_name`` and build the layers."""

    embedding_name = "embed_tokens"
    extra_left = 0  # the logit at position i predicts token i

    def __init__(self, config: ModelConfig, layers: list[nn.Module]):
        super().__init__()
        self.cfg = config
        self.model = nn.Module()
        setattr(self.model, self.embedding_name, nn.Embedding(config.vocab_size, config.hidden_size))
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def embedding(self) -> nn.Embedding:
        return getattr(self.model, self.embedding_name)

    def forward(self, ids: torch.Tensor, ctx: Context | None = None) -> torch.Tensor:
        """ids: [R, n] tokens of the computed positions. Returns float32 logits [R, block, V]
        for the columns ``ctx.targets`` (all computed positions when it is None). Without
        ctx: the whole canvas, no padding, no cache (block-causal at the default block)."""
        c, m = self.cfg, self.model
        if ctx is None:
            ctx = Context.whole_canvas(ids, c.rotary_dim, c.rope_theta, default_attention_block(c))
        x = self.embedding(ids)
        for i, layer in enumerate(m.layers):
            x = layer(ctx.enter(i, x), ctx, i)  # es mode: fewer positions at deeper layers
        x = ctx.leave(len(m.layers), x)
        return self.head_logits(ctx, x)

    def head_logits(self, ctx: Context, x: torch.Tensor) -> torch.Tensor:
        """Float32 logits of the final hidden states x (every computed position) at ctx.targets; a
        family trained with the autoregressive shift (RND1) reads each target's hidden state at i - 1."""
        head = self.embedding.weight if self.cfg.tie_embeddings else self.lm_head.weight
        return logits_at_targets(ctx, x, self.model.norm, head)
