"""Dream (Dream-org): a Qwen2-shaped bidirectional transformer with GQA and
q/k/v biases, trained so that the hidden state at position i-1 predicts the
token at position i. That shift is undone here: logits for position i come
out at index i, like LLaDA's, and no caller ever sees it.

Module names mirror the official checkpoint (Qwen2 layout):
model.{embed_tokens, layers.{i}.*, norm}, lm_head.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ModelLoadError
from .config import ConfigFields, Family, ModelConfig
from .layers import Context, RMSNorm, default_attention_block, swiglu, swiglu_weights


class DreamAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, kv = cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.n_heads * cfg.head_dim, bias=True)
        self.k_proj = nn.Linear(d, kv, bias=True)
        self.v_proj = nn.Linear(d, kv, bias=True)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, d, bias=False)

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(ctx.attend(layer, q, k, v, self.head_dim, rope_fp32=False))


class DreamMLP(nn.Module):
    mlp_kernel = staticmethod(swiglu_weights)  # models/compiled.py may swap in a compiled one

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_proj, self.up_proj, self.down_proj, self.mlp_kernel)


class DreamLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DreamAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DreamMLP(cfg)

    def forward(self, x: torch.Tensor, ctx: Context, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class DreamModel(nn.Module):
    """Maps token ids of the computed positions to position-aligned logits."""

    # Predicting position `start` needs the hidden state of start-1, so prefix
    # and dual passes compute one extra position on the left.
    extra_left = 1

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(DreamLayer(cfg) for _ in range(cfg.n_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, ctx: Context | None = None):
        """ids: [R, n] tokens of the computed positions. Returns float32 logits
        [R, block, V] for the columns ``ctx.targets`` (all computed positions
        when it is None), already aligned (the logit at i predicts token i).
        Without ctx: the whole canvas, no padding, no cache."""
        m = self.model
        if ctx is None:
            ctx = Context.whole_canvas(
                ids, self.cfg.head_dim, self.cfg.rope_theta, default_attention_block(self.cfg)
            )

        x = m.embed_tokens(ids)
        for i, layer in enumerate(m.layers):
            x = layer(ctx.enter(i, x), ctx, i)  # es mode: fewer positions at deeper layers
        x = ctx.leave(len(m.layers), x)  # back to every computed position

        # Undo the shift before the head: row r, target i reads hidden state src[r, i].
        src = self.head_sources(ctx, x)
        x = m.norm(torch.gather(x, 1, src[..., None].expand(-1, -1, x.shape[-1])))
        head = m.embed_tokens.weight if self.cfg.tie_embeddings else self.lm_head.weight
        return nn.functional.linear(x, head).float()

    def head_sources(self, ctx: Context, x: torch.Tensor) -> torch.Tensor:
        """[R, targets] index among the computed positions of the hidden state that predicts each target."""
        targets = ctx.targets
        if targets is None:
            targets = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        return ctx.computed_offsets(self.shift_sources(ctx.mask, targets))

    @staticmethod
    def shift_sources(mask: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[R, n] absolute index of the hidden state that predicts each target
        column: i-1 when i-1 is a real token, else i itself (position 0, and
        the first real token of a left-padded row, reuse their own)."""
        left_real = mask.gather(1, (targets - 1).clamp(min=0)) & (targets > 0)
        return torch.where(left_real, targets - 1, targets)


# ---- config.json -------------------------------------------------------------

# Dream's config.json inherits max_position_embeddings = 131072 from Qwen2.5, but the model
# was trained on about 2048 tokens (REFERENCE.md): longer canvases are accepted only when
# config.json says so with "caidllm_max_length".
DREAM_USABLE_CONTEXT = 2048


def read_dream_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """The ModelConfig sizes of a Dream config.json (Qwen2 field names)."""
    if raw.get("rope_scaling"):
        raise ModelLoadError(
            f"{source}: rope_scaling={raw['rope_scaling']!r} is not supported (expected null)"
        )
    if raw.get("use_sliding_window"):
        raise ModelLoadError(f"{source}: use_sliding_window=true is not supported (expected false)")
    n_heads = get.int("num_attention_heads")
    return dict(
        vocab_size=get.int("vocab_size"),
        hidden_size=get.int("hidden_size"),
        n_layers=get.int("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=get.int("num_key_value_heads", None) or n_heads,
        intermediate_size=get.int("intermediate_size"),
        rope_theta=get.float("rope_theta", 10000.0),
        rms_norm_eps=get.float("rms_norm_eps", 1e-6),
        max_length=min(get.int("max_position_embeddings"), DREAM_USABLE_CONTEXT),
        qkv_bias=True,  # Qwen2 layout: q/k/v always carry biases
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )


# Confidence gating off, cache refresh every 8 steps (DESIGN.md).
DREAM = Family(
    name="dream",
    architectures=("DreamModel",),
    model_types=("dream",),
    read_fields=read_dream_fields,
    model_class=DreamModel,
    confidence_gating=False,
    cache_refresh_every=8,
    description="Dream (Dream-org): Qwen2-shaped bidirectional transformer, shifted logits",
)
