"""Dividing a loaded model among the ranks of a TPGroup, in place (Megatron-style).

- Attention: each rank keeps heads [r H/N, (r+1) H/N) of the queries and the same share of
  the key/value heads (so its KV cache holds only those: lm.config's head counts become the
  rank's); the output projection keeps the matching input columns and sums over ranks.
- Dense feed-forwards: gate and up keep a share of their output rows (column-sharded), down
  the matching input columns (row-sharded), one all-reduce after it: so a block has two
  all-reduces, one after attention and one after the feed-forward.
- Mixture-of-experts: rank r holds experts [r E/N, (r+1) E/N) whole and runs the tokens
  routed to them; a token routed elsewhere contributes zero here; the router runs on every
  rank (replicated: the hidden states are). The shared expert is column/row-sharded like a
  dense one, and both partial sums share the layer's one all-reduce (parallel/experts.py).
- Embeddings, norms and the head stay replicated: every rank then holds the same logits and
  the same hidden states, which is what lets every rank run the same engine steps.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import InputError
from ..models.diffusion_gemma import Layer as DiffusionGemmaLayer
from ..models.dream import DreamAttention, DreamMLP
from ..models.llada import LLaDABlock
from ..models.llada2 import LLaDA2Attention
from ..models.moe import ExpertMLP, MoEFeedForward
from ..models.plan import check_tp_divides
from ..models.sdar import SDARAttention
from ..models.stable_diffcoder import LlamaAttention
from .diffusion_gemma import shard_layer as shard_diffusion_gemma_layer
from .experts import shard_experts
from .layers import RowParallelLinear, head_rows, keep_rows, shard_swiglu
from .mesh import TPGroup


def shard_separate_qkv(module, config, tp: TPGroup, out_name: str) -> None:
    """q_proj / k_proj / v_proj (their biases too) by heads; the output projection row-sharded."""
    hd = config.head_dim
    keep_rows(module.q_proj, head_rows(tp, config.n_heads, hd))
    keep_rows(module.k_proj, head_rows(tp, config.n_kv_heads, hd))
    keep_rows(module.v_proj, head_rows(tp, config.n_kv_heads, hd))
    setattr(
        module, out_name, RowParallelLinear(getattr(module, out_name), head_rows(tp, config.n_heads, hd), tp)
    )


def shard_llada_block(block: LLaDABlock, config, tp: TPGroup) -> None:
    shard_separate_qkv(block, config, tp, "attn_out")
    shard_swiglu(block, ("ff_proj", "up_proj", "ff_out"), tp)


def shard_fused_qkv(attention: LLaDA2Attention, config, tp: TPGroup) -> None:
    """LLaDA2's one query_key_value projection: q | k | v, each part sharded by its heads."""
    hd, (q, k, _) = config.head_dim, attention.sizes
    parts = [
        head_rows(tp, config.n_heads, hd),
        head_rows(tp, config.n_kv_heads, hd),
        head_rows(tp, config.n_kv_heads, hd),
    ]
    offsets = (0, q, q + k)
    rows = torch.cat([torch.arange(o + p.start, o + p.stop) for o, p in zip(offsets, parts)])
    keep_rows(attention.query_key_value, rows)
    attention.sizes = tuple(p.stop - p.start for p in parts)
    attention.dense = RowParallelLinear(attention.dense, head_rows(tp, config.n_heads, hd), tp)


# Module type -> how one rank keeps its share of it (anything else stays replicated).
SHARDERS = {
    LLaDABlock: shard_llada_block,
    SDARAttention: lambda m, c, tp: shard_separate_qkv(m, c, tp, "o_proj"),
    DreamAttention: lambda m, c, tp: shard_separate_qkv(m, c, tp, "o_proj"),
    LlamaAttention: lambda m, c, tp: shard_separate_qkv(m, c, tp, "o_proj"),  # Stable-DiffCoder
    LLaDA2Attention: shard_fused_qkv,
    ExpertMLP: lambda m, c, tp: shard_swiglu(m, ("gate_proj", "up_proj", "down_proj"), tp),
    DreamMLP: lambda m, c, tp: shard_swiglu(m, ("gate_proj", "up_proj", "down_proj"), tp),
    MoEFeedForward: shard_experts,
    DiffusionGemmaLayer: shard_diffusion_gemma_layer,  # both attention kinds, dense MLP, routed experts
}


def shard_modules(model, config, tp: TPGroup) -> None:
    """Divide the modules of `model` (loaded, or still on the meta device) among tp's ranks."""
    check_tp_divides(tp.size, config)
    done = set()
    for module in list(model.modules()):
        sharder = SHARDERS.get(type(module))
        if sharder is None or id(module) in done:
            continue
        sharder(module, config, tp)
        done.update(id(m) for m in module.modules())  # an MoE layer's experts are its own business


def shard_model(lm, tp: TPGroup):
    """Divide `lm` (loaded whole on this rank) among tp's ranks, in place; returns it. Its
    config then gives this rank's head counts (the KV cache a Frame allocates is the rank's)."""
    if tp.size == 1:
        return lm
    if lm.quantization is not None:
        raise InputError(
            f"--tp with --quantize {lm.quantization}: sharding quantized weights is not supported; "
            "run --tp without --quantize"
        )
    if not getattr(lm, "sharded", False):  # parallel/loading.py shards while loading
        shard_modules(lm.model, lm.config, tp)
    config = lm.config
    lm.config = replace(config, n_heads=config.n_heads // tp.size, n_kv_heads=config.n_kv_heads // tp.size)
    lm.tp = tp
    return lm
