"""LLaDA2.2's block routing (config.json ``expert_capacity``, ``block_size``): each diffusion block
admits a pool of ``expert_capacity`` experts, then each of its tokens takes its top-k inside the pool.

Source: the LLaDA2.2 technical report (inclusionAI/LLaDA2.X, LLaDA2_2_tech_report.pdf, section 2.2,
eq. 1: a block's admission score of expert j is the max over its tokens of their routing scores,
"token racing"; the top-C experts by it form the pool, C = 48 of 256) and the released gate
(``LLaDA2MoeGate.block_routing`` in inclusionAI/LLaDA2.2-flash's modeling_llada2_moe.py, as a
public port re-states it): the scores are sigmoid + expert bias, the block's max over them picks the
pool, the scores outside it are masked to -inf for the token's top-k; the weights are the bias-free
scores, normalised and scaled as before; the group fields (n_group, topk_group) are not used.

A block is a run of ``block_size`` positions from position 0 (a request's first prompt token) of one
row. The pool is a function of the block's tokens in the forward that computes them, recomputed at
every forward as the released model does; the exact block cache stays exact because every forward
computes whole blocks (checked here) and a completed block's keys/values come from a forward over its
final tokens (the cache's fold). Padding never joins a block.
"""

from __future__ import annotations

import torch

from ..errors import InputError


def pool_only(for_choice: torch.Tensor, groups: torch.Tensor, capacity: int) -> torch.Tensor:
    """for_choice [T, E] with every expert outside its token's block pool set to -inf.

    groups [T] long: each token's block (any non-negative ids)."""
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    experts = for_choice.shape[1]
    block_scores = for_choice.new_full((n_groups, experts), float("-inf"))
    block_scores.scatter_reduce_(0, groups[:, None].expand(-1, experts), for_choice, "amax")
    pool = block_scores.topk(capacity, dim=-1).indices
    admitted = torch.zeros_like(block_scores, dtype=torch.bool).scatter_(1, pool, True)
    return for_choice.masked_fill(~admitted[groups], float("-inf"))


def flat_groups(tokens: int, block_size: int) -> torch.Tensor:
    """Blocks of a forward without a context: consecutive runs of block_size tokens (the released gate's
    view(-1, block_size, E)), which must tile the tokens."""
    if tokens % block_size:
        raise InputError(
            f"block routing (block_size={block_size}): {tokens} tokens are not whole blocks",
            field="block_size",
        )
    return torch.arange(tokens) // block_size


def context_groups(ctx, block_size: int) -> torch.Tensor:
    """[R * n] block of each computed position of a forward (ctx: models/layers.Context); padding goes to
    block 0, which no real position shares. InputError if a forward computes part of a block's real
    positions (a sub-block or a shadow copy): its pool would not be the released model's. Worked out once
    per forward (every layer computes the same positions on a block-causal model): two host reads."""
    key = ("routing_blocks", block_size)
    if key not in ctx.memo:
        ctx.memo[key] = _groups(ctx, block_size)
    return ctx.memo[key]


def _groups(ctx, block_size: int) -> torch.Tensor:
    positions, real = ctx.computed_columns()
    rows, n = positions.shape
    per_row = int(ctx.positions.max()) // block_size + 1  # blocks of the longest row's canvas
    row_base = torch.arange(rows, device=positions.device)[:, None] * per_row + 1
    groups = torch.where(real, row_base + positions // block_size, 0)
    canvas = torch.where(ctx.mask, row_base + ctx.positions // block_size, 0)
    size = rows * per_row + 1
    computed = torch.bincount(groups[real], minlength=size)
    whole = torch.bincount(canvas[ctx.mask], minlength=size)
    present = computed > 0
    if bool((computed[present] != whole[present]).any()):
        raise InputError(
            f"block routing (block_size={block_size}) needs every forward to compute whole blocks; this "
            "forward computes part of one (a sub-block or shadow cache): use cache 'block' or 'none'",
            field="cache",
        )
    return groups.reshape(rows * n)
