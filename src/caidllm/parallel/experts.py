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
from torch import nn

from ..models.moe import MoEFeedForward
from .layers import shard_swiglu
from .mesh import TPGroup


class ExpertParallelMoE(MoEFeedForward):
    """An MoE layer holding only its rank's experts; forward returns the full layer's output."""

    tp: TPGroup
    first_expert: int  # this rank's experts are [first_expert, first_expert + len(self.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        experts, weights = self.gate(flat)  # replicated routing: every rank sees the same choice
        local = experts - self.first_expert
        mine = (local >= 0) & (local < len(self.experts))
        out = self.run_local_experts(flat, local.masked_fill(~mine, len(self.experts)), weights * mine)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)  # a partial sum of its own (row-sharded down projection)
        return self.tp.all_reduce(out).view(shape)

    def run_local_experts(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """moe.run_experts over this rank's experts; pairs routed elsewhere carry the id
        len(self.experts) and weight 0: they sort last, are never computed, and add zero."""
        tokens, k = experts.shape
        held = len(self.experts)
        pairs = experts.reshape(-1)
        order = pairs.argsort(stable=True)
        counts = torch.bincount(pairs, minlength=held + 1)[:held].tolist()
        routed_inputs = x[order // k]
        routed_outputs = torch.zeros_like(routed_inputs)
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:
                routed_outputs[start:start + count] = expert(routed_inputs[start:start + count])
                start += count
        per_pair = torch.empty_like(routed_outputs)
        per_pair[order] = routed_outputs
        mixed = (per_pair.view(tokens, k, -1).float() * weights.float()[..., None]).sum(dim=1)
        return mixed.to(x.dtype)


def shard_experts(layer: MoEFeedForward, config, tp: TPGroup) -> None:
    """Keep this rank's experts of `layer` (the others are freed) and its share of the shared
    expert's width; the layer then sums over the ranks once (ExpertParallelMoE)."""
    share = tp.shard(layer.config.num_experts)
    layer.experts = nn.ModuleList(list(layer.experts)[share])
    if layer.shared_experts is not None:
        shard_swiglu(layer.shared_experts, ("gate_proj", "up_proj", "down_proj"), tp, reduce=False)
    layer.__class__ = ExpertParallelMoE
    layer.tp, layer.first_expert = tp, share.start
