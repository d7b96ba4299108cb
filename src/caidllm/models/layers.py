"""Pieces shared by LLaDA and Dream: RMSNorm, RoPE, SwiGLU and bidirectional
attention over a (possibly cached) canvas.

The two families name their parameters differently, so each model file owns
its Linear layers (with the official names) and calls these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .cache import KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (bf16 sums of squares lose too much), cast back, then scale.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return x32.to(x.dtype) * self.weight


def swiglu(x: torch.Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    return down(F.silu(gate(x)) * up(x))


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """RoPE positions of a left-padded canvas: the first real token is 0, padding is 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [R, 1, n, head_dim] in fp32 for positions [R, n]."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponent)
    freqs = positions.float()[..., None] * inv_freq  # [R, n, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # rotate-half layout: both halves share freqs
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    # LLaDA rotates in fp32 and casts back; Dream casts cos/sin to the model dtype first.
    if fp32:
        x32 = x.float()
        return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


@dataclass
class Context:
    """What one forward pass computes and where its keys come from.

    The rows ``rows`` of the canvas are computed at positions [lo, hi); keys
    always span the whole canvas [0, L):
    - "full":   lo=0, hi=L, all K/V fresh; written to ``cache`` if one is given.
    - "prefix": hi=L; K/V of [0, lo) read from the cache; cache unchanged.
    - "dual":   K/V of [lo, hi) fresh and written into the cache; all the
                others read from it.
    """

    mode: str
    lo: int
    hi: int
    rows: torch.Tensor | slice  # row indices into the batch / cache
    mask: torch.Tensor  # [R, L] bool, True = real token (key padding mask)
    cos: torch.Tensor  # [R, 1, hi-lo, head_dim] fp32
    sin: torch.Tensor
    cache: KVCache | None = None
    key_mask: torch.Tensor | None = None  # [R, 1, 1, L]; None when nothing is padded

    def __post_init__(self):
        # Without padding, SDPA gets no mask and may pick a fused (flash) kernel.
        if self.key_mask is None and not bool(self.mask.all()):
            self.key_mask = self.mask[:, None, None, :]

    @classmethod
    def build(cls, mask, positions, head_dim, theta, *, mode="full", lo=0, hi=None, rows=None, cache=None):
        """mask, positions: [R, L] of the selected rows."""
        hi = mask.shape[1] if hi is None else hi
        cos, sin = rope_cos_sin(positions[:, lo:hi], head_dim, theta)
        rows = slice(None) if rows is None else rows
        return cls(mode, lo, hi, rows, mask, cos, sin, cache)

    def attend(self, layer: int, q, k, v, head_dim: int, rope_fp32: bool) -> torch.Tensor:
        """Attention for the computed positions. q, k, v: [R, n, heads*head_dim]."""
        R, n, _ = q.shape
        q = q.view(R, n, -1, head_dim).transpose(1, 2)  # [R, H, n, hd]
        k = k.view(R, n, -1, head_dim).transpose(1, 2)  # [R, Hkv, n, hd]
        v = v.view(R, n, -1, head_dim).transpose(1, 2)
        q = apply_rope(q, self.cos, self.sin, rope_fp32)
        k = apply_rope(k, self.cos, self.sin, rope_fp32)

        keys, values = k, v
        c, rows, lo, hi = self.cache, self.rows, self.lo, self.hi
        if self.mode == "full" and c is not None:
            c.keys[layer][rows] = k
            c.values[layer][rows] = v
        elif self.mode == "prefix":
            keys = torch.cat([c.keys[layer][rows, :, :lo], k], dim=2)
            values = torch.cat([c.values[layer][rows, :, :lo], v], dim=2)
        elif self.mode == "dual":
            c.keys[layer][rows, :, lo:hi] = k
            c.values[layer][rows, :, lo:hi] = v
            keys, values = c.keys[layer][rows], c.values[layer][rows]

        groups = q.shape[1] // keys.shape[1]
        if groups > 1:  # grouped-query attention: kv head j serves query heads j*g .. j*g+g-1
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        # Bidirectional: no causal mask, only padding keys are hidden from every query.
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=self.key_mask)
        return out.transpose(1, 2).reshape(R, n, -1)
