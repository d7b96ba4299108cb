"""S2D2's verify forward (decode/policies/s2d2.py): the same block-diffusion weights run at block size 1,
so the model reads the current block causally, as an autoregressive model, against the exact block cache.

Two shapes, as the official code (phymhan/S2D2) runs them per family:
- ``shadow`` (SDAR, LLaDA2.x and every family without a token shift: the "2L trick"): the block with its
  drafted tokens filled in, then a copy of all mask tokens at the same positions. A drafted position sees
  the cached blocks and the drafted positions up to itself; shadow position i sees the cached blocks, the
  drafted positions before i and itself, so its logits are the model's block-size-1 prediction of token i.
- causal (Fast-dLLM v2, whose hidden state at i - 1 predicts token i): the drafted block alone, causal;
  position i's logits read the hidden state of i - 1 among the block's positions, position 0 its own (the
  official ``cat(logits[:, :1], logits[:, :-1])`` over the block).

Nothing is written to the cache: earlier blocks' keys and values are read where they lie (columns
[key_from, start) of the row), the block's are this forward's own. Each row runs alone, so a row's numbers
never depend on its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention import sdpa
from .layers import Context, apply_rope


@dataclass
class VerifyContext(Context):
    """A Context whose keys are a cached prefix (per layer [1, Hkv, P, hd]) and the computed positions."""

    prefix_keys: list = field(default_factory=list)
    prefix_values: list = field(default_factory=list)

    def attend(self, layer: int, q, k, v, head_dim: int, rope_fp32: bool) -> torch.Tensor:
        R, n, _ = q.shape
        q, k, v = (t.view(R, n, -1, head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rope(q, self.cos, self.sin, rope_fp32), apply_rope(k, self.cos, self.sin, rope_fp32)
        keys = torch.cat([self.prefix_keys[layer], k], dim=2)
        values = torch.cat([self.prefix_values[layer], v], dim=2)
        return sdpa(q, keys, values, self.key_mask).transpose(1, 2).reshape(R, n, -1)


def verify_attention(prefix: int, length: int, shadow: bool, device) -> torch.Tensor:
    """[1, 1, n, prefix + n] bool (True = attends): the cached prefix for every query, the block causal;
    with the shadow copy, shadow i reads the block strictly before i and itself."""
    n = 2 * length if shadow else length
    attention = torch.zeros(n, prefix + n, dtype=torch.bool, device=device)
    attention[:, :prefix] = True
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    attention[:length, prefix : prefix + length] = causal
    if shadow:
        attention[length:, prefix : prefix + length] = causal.tril(-1)
        attention[length:, prefix + length :] = torch.eye(length, dtype=torch.bool, device=device)
    return attention[None, None]


@torch.no_grad()
def verify_logits(lm, cache, slot: int, key_from: int, start: int, drafted: torch.Tensor) -> torch.Tensor:
    """Float32 logits [L, V] of the block-size-1 prediction of each block position of cache row `slot`,
    its block [start, start + L) holding `drafted` [L] (masks filled with the draft)."""
    c, L, device = lm.config, drafted.shape[0], drafted.device
    shadow = not lm.model.extra_left
    ids = torch.cat([drafted, torch.full_like(drafted, c.mask_id)]) if shadow else drafted
    block_positions = cache.positions[slot, start : start + L]
    positions = (torch.cat([block_positions, block_positions]) if shadow else block_positions)[None]
    ctx = VerifyContext.build(
        torch.ones_like(positions, dtype=torch.bool),
        positions,
        c.rotary_dim,
        c.rope_theta,
        keeps_hidden=False,
        shift_within_computed=not shadow,
    )
    ctx.prefix_keys = [keys[slot : slot + 1, :, key_from:start] for keys in cache.keys]
    ctx.prefix_values = [values[slot : slot + 1, :, key_from:start] for values in cache.values]
    ctx.key_mask = verify_attention(start - key_from, L, shadow, device)
    if shadow:
        ctx.targets = torch.arange(L, 2 * L, device=device)[None]
    return lm.model(ids[None], ctx)[0].float()
