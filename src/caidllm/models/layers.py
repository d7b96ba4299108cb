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
from .skip import EarlySkip, choose, forced_keeps, importance, relative_drift


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
    - "es":     like dual, but at the layers where ``plan`` drops, only the
                most important block positions go on (models/skip.py); the
                computed positions are then ``index`` (absolute, per row).
    The model calls ``enter`` with the input of each layer and ``leave`` with
    the last layer's output (level n_layers): they keep the cache's hidden
    states and, in es mode, drop positions and restore the skipped ones at the
    end. Other modes pass x through unchanged.
    """

    mode: str
    lo: int
    hi: int
    rows: torch.Tensor | slice  # row indices into the batch / cache
    mask: torch.Tensor  # [R, L] bool, True = real token (key padding mask)
    cos: torch.Tensor  # [R, 1, n, head_dim] fp32, n = positions computed at the current layer
    sin: torch.Tensor
    cache: KVCache | None = None
    key_mask: torch.Tensor | None = None  # [R, 1, 1, L]; None only for the training forward (whole_canvas)
    # es mode only:
    skip: EarlySkip | None = None
    plan: list[int] | None = None  # block positions that run each layer
    start: int = 0  # first block position; [lo, start) are always computed (Dream's start-1)
    index: torch.Tensor | None = None  # [R, n] absolute positions computed at the current layer
    forced: torch.Tensor | None = None  # [R, block] forced keeps

    def __post_init__(self):
        # Always masked, even without padding: the kernel SDPA picks must not depend on
        # whether some other row of the batch is padded (batch invariance).
        if self.key_mask is None:
            self.key_mask = self.mask[:, None, None, :]

    @classmethod
    def whole_canvas(cls, ids: torch.Tensor, head_dim: int, theta: float) -> "Context":
        """Every position of ``ids``, no padding, no cache (as in training)."""
        mask = torch.ones_like(ids, dtype=torch.bool)
        ctx = cls.build(mask, positions_from_mask(mask), head_dim, theta)
        ctx.key_mask = None  # no padding and no batch to stay invariant to: let SDPA pick its fastest kernel
        return ctx

    @classmethod
    def build(cls, mask, positions, head_dim, theta, *, mode="full", lo=0, hi=None, rows=None, cache=None,
              skip=None, plan=None, start=0):
        """mask, positions: [R, L] of the selected rows."""
        hi = mask.shape[1] if hi is None else hi
        cos, sin = rope_cos_sin(positions[:, lo:hi], head_dim, theta)
        rows = slice(None) if rows is None else rows
        ctx = cls(mode, lo, hi, rows, mask, cos, sin, cache)
        if mode == "es":
            R = mask.shape[0]
            ctx.skip, ctx.plan, ctx.start = skip, plan, start
            ctx.index = torch.arange(lo, hi, device=mask.device).expand(R, -1)
            ctx.forced = forced_keeps(skip.prev_confidence, skip.masked, skip.just_committed)
        return ctx

    @property
    def row_ids(self) -> torch.Tensor:
        """[R, 1] absolute row of each computed row, for indexing the cache."""
        if isinstance(self.rows, slice):
            return torch.arange(self.mask.shape[0], device=self.mask.device)[:, None]
        return self.rows[:, None]

    # ---- hidden states and early skipping ------------------------------

    def enter(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x: input of `layer` at the computed positions. Returns the input for
        the positions that run it (es: fewer where the plan drops)."""
        if self.mode == "es" and self.plan[layer] < x.shape[1] - (self.start - self.lo):
            x = self._drop(layer, x)
        self._store_hidden(layer, x)
        return x

    def leave(self, level: int, x: torch.Tensor) -> torch.Tensor:
        """x: output of the last layer (level = n_layers). Returns the final
        hidden states of every position in [lo, hi); in es mode a skipped
        position's come from the cache."""
        self._store_hidden(level, x)
        if self.mode != "es":
            return x
        return self.cache.hidden[level][self.rows, self.lo:self.hi]  # just written where computed, cached elsewhere

    def _store_hidden(self, level: int, x: torch.Tensor) -> None:
        c = self.cache
        if c is None or level not in c.hidden or self.mode == "prefix":
            return
        if self.index is None:
            c.hidden[level][self.rows, self.lo:self.hi] = x
        else:
            c.hidden[level][self.row_ids, self.index] = x

    def _drop(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Keep the plan[layer] most important block positions of each row
        (and the always-computed ones left of the block); narrow x, RoPE and
        the index to them."""
        extra = self.start - self.lo
        running = self.index[:, extra:]  # [R, k] absolute positions of the running block positions
        cached = self.cache.hidden[layer][self.row_ids, running]
        drift = relative_drift(x[:, extra:], cached)
        local = running - self.start
        scores = importance(self.skip.prev_confidence.gather(1, local), drift, self.forced.gather(1, local),
                            self.skip.alpha)
        chosen = choose(scores, self.plan[layer]) + extra
        keep = torch.cat([torch.arange(extra, device=x.device).expand(len(x), -1), chosen], dim=1)
        self.index = self.index.gather(1, keep)
        self.cos = self.cos.gather(2, keep[:, None, :, None].expand(-1, 1, -1, self.cos.shape[-1]))
        self.sin = self.sin.gather(2, keep[:, None, :, None].expand(-1, 1, -1, self.sin.shape[-1]))
        return x.gather(1, keep[..., None].expand(-1, -1, x.shape[-1]))

    # ---- attention ------------------------------------------------------

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
        elif self.mode == "es":
            # Each row writes its own positions; indexing [rows, :, positions] puts them first: [R, n, Hkv, hd].
            c.keys[layer][self.row_ids, :, self.index] = k.transpose(1, 2)
            c.values[layer][self.row_ids, :, self.index] = v.transpose(1, 2)
            keys, values = c.keys[layer][rows], c.values[layer][rows]

        groups = q.shape[1] // keys.shape[1]
        if groups > 1:  # grouped-query attention: kv head j serves query heads j*g .. j*g+g-1
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        # Bidirectional: no causal mask, only padding keys are hidden from every query.
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=self.key_mask)
        return out.transpose(1, 2).reshape(R, n, -1)
