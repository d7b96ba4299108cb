"""DiffusionGemma's layers divided among the ranks (parallel/sharding.py's SHARDERS names it).

- Attention, both kinds: rank r keeps its share of the query heads and of the layer's own key/value heads
  (a sliding layer's 8, a full layer's 2 with V = K: its key projection is also its values') at the
  layer's own head size; the output projection keeps the matching input columns and sums over ranks.
- The dense GELU-tanh MLP: gate and up column-sharded, down row-sharded, summed over ranks before its
  post-norm (the norms are not linear: every sum happens before one).
- The routed experts: rank r holds experts [r E/N, (r+1) E/N) whole and runs every token routed to them
  (the router is replicated); the others' choices weigh zero here; one sum over ranks, before the
  routed branch's norm.
- Embeddings, norms, routers, the self-conditioning MLP and the head stay whole on every rank, so every
  rank holds the same logits and draws the same samples from the same generators.
"""

from __future__ import annotations

import torch

from ..models.diffusion_gemma import Attention, Layer
from ..models.diffusion_gemma_layers import GatedMLP
from ..models.moe_experts import PROJECTIONS
from .layers import RowParallelLinear, head_rows, keep_rows, sliced
from .mesh import TPGroup


def shard_attention(attention: Attention, config, tp: TPGroup) -> None:
    hd = attention.head_dim
    kv = attention.k_proj.out_features // hd
    for projection in (attention.k_proj, attention.v_proj):
        if projection is not None:  # a full layer has no v_proj (V = K)
            keep_rows(projection, head_rows(tp, kv, hd))
    keep_rows(attention.q_proj, head_rows(tp, config.n_heads, hd))
    attention.o_proj = RowParallelLinear(attention.o_proj, head_rows(tp, config.n_heads, hd), tp)


def shard_dense_mlp(mlp: GatedMLP, tp: TPGroup) -> None:
    part = tp.shard(mlp.gate_proj.out_features)
    keep_rows(mlp.gate_proj, part)
    keep_rows(mlp.up_proj, part)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, part, tp)


class ExpertParallelLayer(Layer):
    """A layer holding only its rank's routed experts; `route` returns the sum over every expert."""

    tp: TPGroup
    first_expert: int

    def route(self, inputs: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        held = self.experts.num_experts
        local = chosen - self.first_expert
        mine = (local >= 0) & (local < held)
        # another rank's expert: one of ours at weight 0 (adds nothing; no host sync to drop the pair)
        partial = super().route(inputs, local.clamp(0, held - 1), weights * mine)
        return self.tp.all_reduce(partial)


def shard_layer(layer: Layer, config, tp: TPGroup) -> None:
    shard_attention(layer.self_attn, config, tp)
    shard_dense_mlp(layer.mlp, tp)
    experts = layer.experts
    share = tp.shard(experts.num_experts)
    for name in PROJECTIONS:
        setattr(experts, name, sliced(getattr(experts, name), 0, share))
    experts.num_experts = share.stop - share.start
    layer.__class__ = ExpertParallelLayer
    layer.tp, layer.first_expert = tp, share.start
