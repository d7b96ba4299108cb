"""LLaDA-MoE (inclusionAI, LLaDA-MoE-7B-A1B-Base / -Instruct): LLaDA's masked diffusion on an
OLMoE-shaped transformer: RMSNorm over each head of q and k before RoPE, and a
mixture-of-experts feed-forward layer (models/moe.py: softmax over 64 experts, top 8,
weights not renormalised) from the first layer config.json's moe_layer_freq marks as MoE on (a
dense SwiGLU of dense_intermediate_size before it; the released checkpoints have none). Logits
are not shifted (as LLaDA's).

Module names mirror the official checkpoint (OLMoE layout): model.{embed_tokens,
layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
post_attention_layernorm, mlp.gate, mlp.experts.{e}.{gate,up,down}_proj}, norm}, lm_head.
"""

from __future__ import annotations

from ..errors import ModelLoadError
from .config import ConfigFields, Family, ModelConfig
from .decoder import DecoderLM, PreNormLayer
from .moe import MoEConfig
from .sdar import SDARAttention


class LLaDAMoEModel(DecoderLM):
    """Maps token ids of the computed positions to logits (no shift). Its attention is SDAR's
    (Qwen3 and OLMoE share it: no biases, an RMSNorm over each head of q and k before RoPE,
    the rotary tables cast to the model dtype) and its layers the shared pre-norm ones."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, [PreNormLayer(cfg, i, SDARAttention(cfg)) for i in range(cfg.n_layers)])


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
        raise ModelLoadError(
            f"{source}: field 'moe_layer_freq' = {freq!r} must list 0 (dense) or 1 (MoE) "
            f"for each of the {n_layers} layers"
        )
    dense_layers = freq.index(1) if 1 in freq else n_layers
    if any(f == 0 for f in freq[dense_layers:]):  # the released checkpoints are MoE in every layer
        raise ModelLoadError(
            f"{source}: field 'moe_layer_freq' = {freq!r}: caidllm runs dense layers first, then "
            "MoE ones (a dense layer after an MoE one is not supported)"
        )
    # the official gate runs in the model dtype, its softmax in fp32
    moe = MoEConfig(
        hidden_size=hidden,
        moe_intermediate_size=get.int("expert_intermediate_size"),
        num_experts=get.int("num_experts"),
        num_experts_per_tok=get.int("num_experts_per_tok"),
        score_function="softmax",
        norm_topk_prob=False,
        router_fp32=False,
    )
    # The dense layers' width: required only when some layer is dense (the released checkpoints have none).
    dense_width = (
        get.int("dense_intermediate_size") if dense_layers else get.int("dense_intermediate_size", 0)
    )
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
    name="llada_moe",
    architectures=("LLaDAMoEModelLM",),
    model_types=("lladamoe", "llada_moe", "llada"),
    read_fields=read_llada_moe_fields,
    model_class=LLaDAMoEModel,
    confidence_gating=True,
    cache_refresh_every=16,
    description="LLaDA-MoE (inclusionAI): OLMoE-shaped, QK-norm, 64 experts top-8 (models/moe.py)",
)
