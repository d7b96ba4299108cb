"""Expert parallelism: rank r of N holds experts [r E/N, (r+1) E/N) of each MoE layer.

Why one all-reduce rather than an all-to-all: after attention's all-reduce every rank holds
the hidden states of every token, and a diffusion step's forward is small (a block of 4-32
positions per row, a few rows), so each rank can route every token itself (the router is
replicated), run its own experts on the (token, expert) pairs routed to them, leave zero for
the others, and let one all-reduce of [tokens, hidden] sum the experts' outputs together
with the shared expert's row-sharded partial: one collective per MoE layer, the same as a
dense layer, no per-step exchange of token counts (an all-to-all needs each rank's counts
first: a host sync and a second collective) and no padding to a capacity.
"""

from __future__ import annotations

import torch

from ..models.moe import MoEFeedForward
from ..models.moe_experts import PROJECTIONS
from ..models.moe_kernels import run_experts
from .layers import shard_swiglu, sliced
from .mesh import TPGroup


class ExpertParallelMoE(MoEFeedForward):
    """An MoE layer holding only its rank's experts; forward returns the full layer's output."""

    tp: TPGroup
    first_expert: int  # this rank's experts are [first_expert, first_expert + experts.num_experts)

    def forward(self, x: torch.Tensor, ctx=None) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        chosen, weights = self.route_tokens(flat, ctx)  # replicated routing: every rank sees the same choice
        held = self.experts.num_experts
        local = chosen - self.first_expert
        mine = (local >= 0) & (local < held)
        # A choice of another rank's expert goes to one of ours with weight 0: it adds nothing, and
        # the kernel (moe_kernels.py, unchanged) runs without a host sync to drop it.
        out = run_experts(self.experts, self.kernel, flat, local.clamp(0, held - 1), weights * mine)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)  # a partial sum of its own (row-sharded down projection)
        return self.tp.all_reduce(out).view(shape)


def shard_experts(layer: MoEFeedForward, config, tp: TPGroup) -> None:
    """Keep this rank's experts of `layer` (the others are freed) and its share of the shared
    expert's width; the layer then sums over the ranks once (ExpertParallelMoE)."""
    share = tp.shard(layer.config.num_experts)
    experts = layer.experts
    for name in PROJECTIONS:
        setattr(experts, name, sliced(getattr(experts, name), 0, share))  # experts [share] whole
    experts.num_experts = share.stop - share.start
    if layer.shared_experts is not None:
        shard_swiglu(layer.shared_experts, ("gate_proj", "up_proj", "down_proj"), tp, reduce=False)
    layer.__class__ = ExpertParallelMoE
    layer.tp, layer.first_expert = tp, share.start
