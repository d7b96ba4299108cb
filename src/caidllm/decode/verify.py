"""WINO's verify forward (policies/wino.py): the canvas plus a shadow copy of the current
block, all mask tokens at the block's own positions. Canvas positions attend to the canvas
only; shadow position j attends to the shadow block and to every canvas position except
block position j, so its logits say how well the rest of the canvas supports the token at j.

Each row runs alone (its own unpadded canvas), so a row's numbers never depend on its
neighbours: batch invariance by construction, at the cost of one forward per row.
"""

from __future__ import annotations

import torch

from caidllm.errors import InputError


def shadow_inputs(canvas: torch.Tensor, block_start: int, block_length: int, mask_id: int):
    """ids [1, n + b], positions [1, n + b], attention [1, 1, n + b, n + b] and the target
    columns [1, 2b] (the block, then its shadow) of one unpadded canvas row [n]."""
    n, b, device = canvas.shape[0], block_length, canvas.device
    shadow = torch.full((b,), mask_id, dtype=canvas.dtype, device=device)
    ids = torch.cat([canvas, shadow])[None]
    block = torch.arange(block_start, block_start + b, device=device)
    positions = torch.cat([torch.arange(n, device=device), block])[None]
    attention = torch.ones(n + b, n + b, dtype=torch.bool, device=device)
    attention[:, n:] = False
    attention[n:, n:] = True
    attention[n:, block_start:block_start + b] = ~torch.eye(b, dtype=torch.bool, device=device)
    targets = torch.cat([block, torch.arange(n, n + b, device=device)])[None]
    return ids, positions, attention[None, None], targets


def verify_forward(lm, frame, slots: list[int], starts: list[int], block_length: int):
    """Logits of each row's block [R, b, V] and of its shadow block [R, b, V]."""
    if lm.model.extra_left:
        raise InputError(f"WINO's verify forward needs a family without a logit shift; {lm.config.family} "
                         "predicts position i from i - 1")
    blocks, shadows = [], []
    for slot, start in zip(slots, starts):
        first = frame.first_real(slot)
        ids, positions, attention, targets = shadow_inputs(frame.canvas[slot, first:], start - first, block_length,
                                                           lm.config.mask_id)
        logits = lm.forward_with_attention(ids, positions, attention, targets)
        blocks.append(logits[:, :block_length])
        shadows.append(logits[:, block_length:])
    return torch.cat(blocks), torch.cat(shadows)


def token_probability(logits: torch.Tensor, tokens: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[R, b] probability of `tokens` under `logits`, the mask token excluded (never predicted)."""
    logits = logits.float().clone()
    logits[..., mask_id] = float("-inf")
    return torch.softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
