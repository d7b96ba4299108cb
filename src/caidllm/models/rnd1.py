"""RND1 (Radical Numerics, ``RND1LM``, model_type ``rnd1``): Qwen3-30B-A3B converted into a
full-sequence masked diffusion model. Its modeling file is Qwen3-MoE's layers with bidirectional
attention (``is_causal = False``): grouped-query attention with an RMSNorm over each head of q and k,
no biases, RoPE on whole heads; Qwen3-MoE's experts in every layer (softmax over the router logits,
top 8 of 128, the chosen weights renormalised when norm_topk_prob, no shared expert). It keeps the
autoregressive shift (its sampler: "pos i predicts token i+1"), undone here as Dream's is, so callers
see logits aligned to positions.

Module names mirror the checkpoint (Qwen3-MoE layout): model.embed_tokens, model.layers.{i}.{
input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.gate,
mlp.experts.{e}.{gate,up,down}_proj}, model.norm, lm_head.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ModelLoadError
from .config import ConfigFields, Family, ModelConfig
from .decoder import DecoderLM, PreNormLayer
from .dream import DreamModel
from .layers import Context
from .moe import MoEConfig
from .sdar import SDARAttention


class RND1Model(DecoderLM):
    """SDAR's attention (Qwen3's) and the shared pre-norm layers with an MoE feed-forward in every
    layer; the logit at i is read from the hidden state at i - 1."""

    extra_left = 1  # predicting position `start` needs the hidden state of start - 1

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, [PreNormLayer(cfg, i, SDARAttention(cfg)) for i in range(cfg.n_layers)])

    def head_logits(self, ctx: Context, x: torch.Tensor) -> torch.Tensor:
        targets = ctx.targets
        if targets is None:
            targets = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        src = ctx.computed_offsets(DreamModel.shift_sources(ctx.mask, targets))
        x = self.model.norm(torch.gather(x, 1, src[..., None].expand(-1, -1, x.shape[-1])))
        head = self.embedding.weight if self.cfg.tie_embeddings else self.lm_head.weight
        return nn.functional.linear(x, head).float()


# ---- config.json -------------------------------------------------------------

# configuration_rnd.py's CONFIG_DEFAULTS ("Qwen3-30B-A3B / checkpoint defaults"): what an absent field means.
RND1_DEFAULTS = {
    "eos_token_id": 151645,
    "pad_token_id": 151643,
    "mask_token_id": 151669,
    "max_position_embeddings": 40960,
    "norm_topk_prob": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "head_dim": 128,
}
# Settings the released forward leaves at these values and this implementation does not model otherwise.
RND1_SUPPORTED_SETTINGS = {
    "hidden_act": ("silu", None),
    "attention_bias": (False, None),
    "rope_scaling": (None, False),
    "use_sliding_window": (False, None),
    "decoder_sparse_step": (1, None),
    "mlp_only_layers": ([], None),
}


def read_rnd1_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """The ModelConfig fields of an RND1 config.json (Qwen3-MoE field names; absent ones take
    configuration_rnd.py's defaults)."""
    for key, allowed in RND1_SUPPORTED_SETTINGS.items():
        if raw.get(key) not in allowed:
            raise ModelLoadError(
                f"{source}: unsupported RND1 setting {key}={raw.get(key)!r} (expected "
                + " or ".join(repr(v) for v in allowed if v is not None)
                + ")"
            )
    raw = {**RND1_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    get = ConfigFields(raw, source)
    hidden, n_heads = get.int("hidden_size"), get.int("num_attention_heads")
    # the official gate runs in the model dtype, its softmax in fp32
    moe = MoEConfig(
        hidden_size=hidden,
        moe_intermediate_size=get.int("moe_intermediate_size"),
        num_experts=get.int("num_experts"),
        num_experts_per_tok=get.int("num_experts_per_tok"),
        score_function="softmax",
        norm_topk_prob=get.bool("norm_topk_prob"),
        router_fp32=False,
    )
    return dict(
        vocab_size=get.int("vocab_size"),
        hidden_size=hidden,
        n_layers=get.int("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=get.int("num_key_value_heads", None) or n_heads,
        head_dim=get.int("head_dim"),
        intermediate_size=get.int("intermediate_size", 0),
        rope_theta=get.float("rope_theta"),
        rms_norm_eps=get.float("rms_norm_eps"),
        max_length=get.int("max_position_embeddings"),
        qkv_bias=False,
        tie_embeddings=get.bool("tie_word_embeddings", False),
        qk_norm=True,
        moe=moe,
        eos_id=get.int("eos_token_id"),
        mask_id=get.int("mask_token_id"),
    )


# Confidence gating off, refresh every 8: Dream's values (the other shifted, AR-adapted family; not measured).
RND1 = Family(
    name="rnd1",
    architectures=("RND1LM",),
    model_types=("rnd1",),
    read_fields=read_rnd1_fields,
    model_class=RND1Model,
    confidence_gating=False,
    cache_refresh_every=8,
    description="RND1 (Radical Numerics): Qwen3-MoE layout, bidirectional, shifted logits, 128 experts top 8",
)
