"""WINO's verify forward (decode/policies/wino.py): a canvas plus a shadow copy of its current
block, all mask tokens at the block's own positions. Canvas positions attend to the canvas
only; shadow position j attends to the shadow block and to every canvas position except
block position j, so its logits say how well the rest of the canvas supports the token at j.

Each row runs alone (its own unpadded canvas), so a row's numbers never depend on its
neighbours: batch invariance by construction, at the cost of one forward per row.
"""

from __future__ import annotations

import torch

from ..errors import InputError


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
    attention[n:, block_start : block_start + b] = ~torch.eye(b, dtype=torch.bool, device=device)
    targets = torch.cat([block, torch.arange(n, n + b, device=device)])[None]
    return ids, positions, attention[None, None], targets


def shadow_forward(
    lm, canvases: list[torch.Tensor], block_starts: list[int], block_length: int
) -> torch.Tensor:
    """Logits [R, 2b, V]: each unpadded canvas row's block, then its shadow block."""
    if lm.model.extra_left:
        raise InputError(
            f"the verify forward needs unshifted logits; family {lm.config.family!r} predicts "
            "position i from i - 1"
        )
    out = []
    for canvas, start in zip(canvases, block_starts):
        ids, positions, attention, targets = shadow_inputs(canvas, start, block_length, lm.config.mask_id)
        out.append(lm.forward_with_attention(ids, positions, attention, targets))
    return torch.cat(out)
