"""Fast-dLLM v2's within-block cache forward (mode "subblock"): the official generator's
``use_block_cache`` path. Once a sub-block's first position is decoded, a step computes that
sub-block only: its fresh keys/values are written into the cache; the other positions of the
current block are read from it as the block's last whole forward (or a later sub-block forward)
wrote them, earlier blocks as the exact block cache holds them; later blocks are never seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from .cache import KVCache
from .forward_modes import ForwardMode
from .layers import Context


@dataclass
class SubBlockInputs:
    """columns: [R, n] absolute canvas columns of each row's sub-block (ascending); block_at: [R, block]
    index of each block position among them (0 where it is not one: no policy commits it)."""

    columns: torch.Tensor
    block_at: torch.Tensor


@torch.no_grad()
def forward_sub_block(lm, ids: torch.Tensor, cache: KVCache, sub_block: SubBlockInputs, attention_block: int,
                      rows=None, real_from: list[int] | None = None) -> torch.Tensor:
    """Float32 logits [R, block, V] of the selected rows' current blocks from a forward of their
    sub-blocks (positions outside the sub-block get its first position's logits)."""
    if not lm.config.block_causal:
        raise InputError(f"the subblock forward needs a block-causal model; the {lm.config.family} model's "
                         "attention is bidirectional")
    r = slice(None) if rows is None else rows
    c = lm.config
    ctx = Context.build(cache.attention_mask[r], cache.positions[r], c.rotary_dim, c.rope_theta,
                        mode=ForwardMode.SUBBLOCK.value, rows=rows, cache=cache, real_from=real_from,
                        columns=sub_block.columns, attention_block=attention_block)
    logits = lm.model(ids[r].gather(1, sub_block.columns), ctx)
    return logits.gather(1, sub_block.block_at[..., None].expand(-1, -1, logits.shape[-1]))
