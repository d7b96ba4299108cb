"""config.json of the block-diffusion families, LLaDA2 (``llada2_moe``), SDAR (``sdar``,
``sdar_moe``) and Fast-dLLM v2 (``fast_dllm_qwen``), read into ModelConfig fields (the registry's read_fields
of their entries in llada2.py / sdar.py): official field names, the official defaults where a field is absent
(the families' configuration classes), and a clear error where a field asks for something
the official forward does not do.

Both use the Hugging Face field names (hidden_size, num_hidden_layers, ...); docs/
block-diffusion-models.md lists each field and where its meaning comes from.
"""

from __future__ import annotations

from ..errors import ModelLoadError
from .config import ConfigFields, check_heads
from .moe import SCORE_FUNCTIONS, MoEConfig

# Token ids of the official tokenizers (defaults when config.json does not name them):
# LLaDA2's generate() defaults mask_id=156895, eos_id=156892; SDAR's config.json has
# mask_token_id 151669 and eos_token_id 151643 (Qwen3's <|endoftext|>).
LLADA2_IDS = {"mask": 156895, "eos": 156892}
SDAR_IDS = {"mask": 151669, "eos": 151643}
# Fast-dLLM v2: its generate()'s defaults mask_id=151665 ("|<MASK>|", added to Qwen2.5's vocabulary),
# stop_token=151645 (Qwen2.5's <|im_end|>, also config.json's eos_token_id).
FASTDLLM_V2_IDS = {"mask": 151665, "eos": 151645}
# Block lengths the models were trained with: LLaDA2 32 (its generate()'s default
# block_length), SDAR its config's block_size (4).
LLADA2_BLOCK, SDAR_BLOCK = 32, 4
FASTDLLM_V2_BLOCK = 32  # config.json's bd_size (the training block; its eval.py's bd_size 32)
# Stable-DiffCoder: its config.json names neither; the modeling file's generate_block defaults mask_id=5 and
# block_length=4 (the README's example too), and config.json's eos_token_id is 2.
STABLE_DIFFCODER_IDS = {"mask": 5, "eos": 2}
STABLE_DIFFCODER_BLOCK = 4


def read_llada2_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """LLaDA2MoeModelLM: fused q/k/v, QK-norm (use_qk_norm), RoPE on partial_rotary_factor of
    each head, first_k_dense_replace dense layers, then MoE layers routed as LLaDA2MoeGate does.
    Absent fields take LLaDA2MoeConfig's defaults (use_qk_norm true, partial_rotary_factor 0.5,
    n_group 8, topk_group 4, routed_scaling_factor 2.5); use_bias must be false (its default
    is true, an output bias this implementation does not have)."""
    _expect(
        raw,
        source,
        "LLaDA2",
        hidden_act=("silu", None),
        rope_scaling=(None,),
        use_sliding_window=(False, None),
        use_bias=(False,),
        norm_head=(False, None),
    )
    shape = _attention_shape(get, source)
    head_dim = shape["head_dim"]
    rope_dim = int(head_dim * get.float("partial_rotary_factor", 0.5))  # the configuration class's default
    if rope_dim <= 0 or rope_dim % 2 or rope_dim > head_dim:
        raise ModelLoadError(
            f"{source}: partial_rotary_factor={raw.get('partial_rotary_factor')!r} gives "
            f"{rope_dim} rotary dimensions of {head_dim}; expected an even number in 2..{head_dim}"
        )
    if raw.get("rotary_dim") is not None and get.int("rotary_dim") != rope_dim:
        raise ModelLoadError(
            f"{source}: rotary_dim={raw['rotary_dim']!r} contradicts partial_rotary_factor "
            f"(head_dim {head_dim} x {raw.get('partial_rotary_factor')} = {rope_dim})"
        )
    n_layers = get.int("num_hidden_layers")
    dense_layers = get.int("first_k_dense_replace", 0)
    if not 0 <= dense_layers <= n_layers:
        raise ModelLoadError(
            f"{source}: first_k_dense_replace={dense_layers} must be in 0..num_hidden_layers ({n_layers})"
        )
    moe = _llada2_moe(raw, get, source) if get.int("num_experts", None) else None
    fields = _fields(
        raw,
        get,
        source,
        shape,
        n_layers=n_layers,
        rope_dim=rope_dim,
        moe=moe,
        dense_layers=dense_layers,
        qk_norm=get.bool("use_qk_norm", True),
        qkv_bias=get.bool("use_qkv_bias", False),
        ids=LLADA2_IDS,
        block=get.int("block_size", LLADA2_BLOCK),
    )
    if moe is not None and moe.expert_capacity:
        _check_routing_blocks(fields["block_lengths"], moe.block_size, source)
    fields["edit_tokens"] = _edit_tokens(raw, get, source, fields)
    return fields


def _edit_tokens(raw: dict, get: ConfigFields, source: str, fields: dict) -> tuple[int, int] | None:
    """LLaDA2.2's DELETE and SPLIT token ids: both or neither, distinct, in the vocabulary, not the mask."""
    names = ("delete_token_id", "split_token_id")
    given = [raw.get(name) is not None for name in names]
    if not any(given):
        return None
    if not all(given):
        raise ModelLoadError(
            f"{source}: {names[given.index(False)]} is missing (InDel needs both edit tokens)"
        )
    ids = tuple(get.int(name) for name in names)
    for name, value in zip(names, ids):
        if not 0 <= value < fields["vocab_size"]:
            raise ModelLoadError(
                f"{source}: {name}={value} is outside the vocabulary (0..{fields['vocab_size'] - 1})"
            )
    if len({*ids, fields["mask_id"]}) < 3:
        raise ModelLoadError(f"{source}: delete_token_id, split_token_id and the mask token must be distinct")
    return ids


def _check_routing_blocks(lengths, block_size: int, source: str) -> None:
    """A decoding block must be whole routing blocks: a routing block across two decoding blocks would
    take its pool from the next block's masks (neither the released model's nor cacheable)."""
    for n in lengths:
        if n % block_size:
            raise ModelLoadError(
                f"{source}: block length {n} is not a multiple of block_size={block_size} (the block "
                "routing's block)"
            )


def _llada2_moe(raw: dict, get: ConfigFields, source: str) -> MoEConfig:
    # The official gate always takes sigmoid scores, always has an expert_bias buffer, and
    # normalises the top-k weights whenever it picks more than one expert.
    score = raw.get("score_function", "sigmoid")
    if score not in SCORE_FUNCTIONS:
        raise ModelLoadError(
            f"{source}: unknown score_function={score!r}; expected one of {sorted(SCORE_FUNCTIONS)}"
        )
    if score != "sigmoid":
        raise ModelLoadError(
            f"{source}: score_function={score!r} contradicts LLaDA2, whose router always takes sigmoid scores"
        )
    top_k = get.int("num_experts_per_tok")
    capacity = get.int("expert_capacity", 0) or 0
    if raw.get("norm_topk_prob") is False and top_k > 1:
        raise ModelLoadError(
            f"{source}: norm_topk_prob=false contradicts LLaDA2, whose router always "
            "normalises the top-k weights"
        )
    return _moe(
        source,
        hidden_size=get.int("hidden_size"),
        moe_intermediate_size=get.int("moe_intermediate_size"),
        num_experts=get.int("num_experts"),
        num_experts_per_tok=top_k,
        score_function="sigmoid",
        n_group=get.int("n_group", 8),
        topk_group=get.int("topk_group", 4),
        norm_topk_prob=top_k > 1,
        routed_scaling_factor=get.float("routed_scaling_factor", 2.5),
        expert_bias=True,
        num_shared_experts=get.int("num_shared_experts", 0),
        router_fp32=True,
        # LLaDA2.2: a pool of expert_capacity experts per block of block_size positions (absent: tokens route)
        expert_capacity=capacity,
        block_size=get.int("block_size", LLADA2_BLOCK) if capacity else 0,
    )


def read_sdar_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """SDARForCausalLM (Qwen3 layout, block-causal) and SDARMoeForCausalLM (Qwen3-MoE experts
    in every layer)."""
    _expect(
        raw, source, "SDAR", hidden_act=("silu", None), rope_scaling=(None,), use_sliding_window=(False, None)
    )
    architectures = raw.get("architectures") or []
    is_moe = "SDARMoeForCausalLM" in architectures or str(raw.get("model_type", "")).lower() == "sdar_moe"
    if is_moe != bool(get.int("num_experts", None)):
        raise ModelLoadError(
            f"{source}: num_experts={raw.get('num_experts')!r} contradicts architectures="
            f"{architectures!r} / model_type={raw.get('model_type')!r} (the MoE variant "
            "is SDARMoeForCausalLM and needs num_experts; the dense one has none)"
        )
    moe = None
    if is_moe:
        if get.int("decoder_sparse_step", 1) != 1 or raw.get("mlp_only_layers"):
            raise ModelLoadError(
                f"{source}: decoder_sparse_step={raw.get('decoder_sparse_step')!r} / "
                f"mlp_only_layers={raw.get('mlp_only_layers')!r}: only an MoE feed-forward "
                "in every layer (1 / []) is supported"
            )
        moe = _moe(
            source,
            hidden_size=get.int("hidden_size"),
            moe_intermediate_size=get.int("moe_intermediate_size"),
            num_experts=get.int("num_experts"),
            num_experts_per_tok=get.int("num_experts_per_tok"),
            score_function="softmax",
            norm_topk_prob=get.bool("norm_topk_prob", False),
            router_fp32=False,
        )
    return _fields(
        raw,
        get,
        source,
        _attention_shape(get, source),
        n_layers=get.int("num_hidden_layers"),
        moe=moe,
        qk_norm=True,
        qkv_bias=get.bool("attention_bias", False),
        ids=SDAR_IDS,
        block=get.int("block_size", SDAR_BLOCK),
    )


def read_fastdllm_v2_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """Fast_dLLM_QwenForCausalLM (NVlabs Fast-dLLM v2): Qwen2.5's layout (q/k/v biases, no QK-norm,
    RoPE on whole heads), block-causal attention over blocks of bd_size."""
    _expect(
        raw,
        source,
        "Fast-dLLM v2",
        hidden_act=("silu", None),
        rope_scaling=(None,),
        use_sliding_window=(False, None),
    )
    if raw.get("caidllm_block_lengths") is None:
        raw = {**raw, "caidllm_block_lengths": [get.int("bd_size", FASTDLLM_V2_BLOCK)]}
    return _fields(
        raw,
        get,
        source,
        _attention_shape(get, source),
        n_layers=get.int("num_hidden_layers"),
        qk_norm=False,
        qkv_bias=True,
        ids=FASTDLLM_V2_IDS,
        block=FASTDLLM_V2_BLOCK,
    )


def read_stable_diffcoder_fields(raw: dict, get: ConfigFields, source: str) -> dict:
    """StableDiffcoderForCausalLM (ByteDance Seed): transformers' LlamaForCausalLM (Seed-Coder's layout: no
    biases, no QK-norm, RoPE on whole heads) run block-causal over blocks of 4, logits unshifted."""
    _expect(
        raw,
        source,
        "Stable-DiffCoder",
        hidden_act=("silu", None),
        rope_scaling=(None,),
        attention_bias=(False, None),
        mlp_bias=(False, None),
    )
    return _fields(
        raw,
        get,
        source,
        _attention_shape(get, source),
        n_layers=get.int("num_hidden_layers"),
        qk_norm=False,
        qkv_bias=False,
        ids=STABLE_DIFFCODER_IDS,
        block=get.int("block_size", STABLE_DIFFCODER_BLOCK),
    )


def _moe(source: str, **fields) -> MoEConfig:
    try:
        return MoEConfig(**fields)
    except ModelLoadError as e:
        raise ModelLoadError(f"{source}: {e}") from None


def _expect(raw: dict, source: str, family: str, **allowed) -> None:
    """Settings the official forward does not model: refuse them rather than compute something else."""
    for key, values in allowed.items():
        if raw.get(key) not in values:
            wanted = " or ".join(repr(v) for v in values if v is not None) or "null"
            raise ModelLoadError(
                f"{source}: unsupported {family} setting {key}={raw.get(key)!r} (expected {wanted})"
            )


def _attention_shape(get: ConfigFields, source: str) -> dict:
    d, h = get.int("hidden_size"), get.int("num_attention_heads")
    if h <= 0:
        raise ModelLoadError(f"{source}: num_attention_heads={h} must be positive")
    kv = get.int("num_key_value_heads", None) or h  # 0 / absent: one key/value head per query head
    head_dim = get.int("head_dim", None) or d // h
    check_heads(h, kv, head_dim, source)
    return dict(hidden_size=d, n_heads=h, n_kv_heads=kv, head_dim=head_dim)


def _fields(
    raw, get, source, shape, *, n_layers, ids, block, qk_norm, qkv_bias, moe=None, rope_dim=0, dense_layers=0
) -> dict:
    """The ModelConfig fields both families read alike (token ids default to the official ones)."""
    eos_id = get.int("eos_token_id", None)
    if eos_id is None:
        eos_id = get.int("pad_token_id", ids["eos"])
    lengths = raw.get("caidllm_block_lengths", [block])
    if not (
        isinstance(lengths, list)
        and lengths
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths)
    ):
        raise ModelLoadError(
            f"{source}: block lengths {lengths!r} (block_size / caidllm_block_lengths) must be "
            "positive integers"
        )
    return dict(
        vocab_size=get.int("vocab_size"),
        n_layers=n_layers,
        intermediate_size=get.int("intermediate_size"),
        rope_theta=get.float("rope_theta", 10000.0),
        rms_norm_eps=get.float("rms_norm_eps", 1e-6),
        max_length=get.int("max_position_embeddings"),
        qkv_bias=qkv_bias,
        tie_embeddings=get.bool("tie_word_embeddings", False),
        mask_id=get.int("mask_token_id", ids["mask"]),
        eos_id=eos_id,
        block_causal=True,
        block_lengths=tuple(lengths),
        rope_dim=rope_dim,
        qk_norm=qk_norm,
        moe=moe,
        dense_layers=dense_layers,
        **shape,
    )
