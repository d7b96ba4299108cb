"""Elastic-Cache's forward (mode "elastic"): Nguyen-Tri, Ranjan and Shen, "Attention Is All You Need
for KV Cache in Diffusion LLMs" (arXiv 2510.14973; official code VILA-Lab/Elastic-Cache).

Between refreshes a forward computes only some columns of each row (the sliding window of the block,
the positions that predict it, and the previous step's most-attended tokens); every other column's
K/V are read from the cache. From layer ``refresh_from`` on (``n_layers``: nowhere) it computes every
column instead: their input there is the hidden state the cache holds for that layer (written by the
last forward that ran it), the computed columns' fresh one where they were computed, and their K/V and
hidden states are written back (the shallow layers keep theirs). At every layer it also measures,
per row, how the window's queries spread their attention over the row's real keys (the profile
[heads, keys] the drift test of decode/elastic.py reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .layers import Context, apply_rope, rope_cos_sin


@dataclass
class ElasticInputs:
    """One elastic forward's columns, for R rows with equal counts (absolute canvas columns, ascending).

    columns: [R, n] computed at every layer; window: [R, k] the block positions it predicts (their
    logits come back in this order); refresh_from: the first layer computed over every column.
    After the forward, ``profiles[r][layer]`` is row r's attention profile [heads, its real keys]."""

    columns: torch.Tensor
    window: torch.Tensor
    refresh_from: int
    block_at: torch.Tensor | None = None  # [R, block] index of each block position in `window` (0 where it is not)
    profiles: list[list[torch.Tensor]] = field(default_factory=list)
    computed_pairs: int = 0


@dataclass
class ElasticContext(Context):
    """A Context over chosen columns that widens to the whole canvas at ``refresh_from``."""

    refresh_from: int = 0
    rotary_dim: int = 0
    theta: float = 0.0
    window: torch.Tensor | None = None  # [R, k] absolute columns whose attention is profiled
    profiles: list[list[torch.Tensor]] | None = None

    def enter(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        if layer == self.refresh_from:
            x = self._widen(layer, x)
        return super().enter(layer, x)

    def _widen(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Every column from here on: the cached inputs of this layer, with the computed columns' fresh ones."""
        R, L = self.mask.shape
        whole = self.cache.hidden[layer][self.row_ids[:, 0]].clone()  # [R, L, d]
        whole.scatter_(1, self.index[..., None].expand(-1, -1, x.shape[-1]), x)
        self.index = torch.arange(L, device=x.device).expand(R, -1)
        self.cos, self.sin = rope_cos_sin(self.positions, self.rotary_dim, self.theta)
        return whole

    def _offsets(self, absolute: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self.index.contiguous(), absolute.contiguous())

    def target_offsets(self) -> torch.Tensor | None:
        return self._offsets(self.targets)

    def computed_offsets(self, absolute: torch.Tensor) -> torch.Tensor:
        return self._offsets(absolute)

    def attend(self, layer: int, q, k, v, head_dim: int, rope_fp32: bool) -> torch.Tensor:
        out = super().attend(layer, q, k, v, head_dim, rope_fp32)  # writes the computed columns' K/V first
        R, n, _ = q.shape
        queries = apply_rope(q.view(R, n, -1, head_dim).transpose(1, 2), self.cos, self.sin, rope_fp32)
        at = self._offsets(self.window)
        keys = self.cache.keys[layer]
        for r in range(R):  # each row alone over its own real keys: its numbers never depend on its neighbours
            first = self.real_from[r] if self.real_from is not None else 0
            key_r = keys[self.row_ids[r, 0], :, first:].float()  # [Hkv, Lr, hd]
            q_r = queries[r][:, at[r]].float()  # [H, k, hd]
            key_r = key_r.repeat_interleave(q_r.shape[0] // key_r.shape[0], dim=0)
            weights = torch.softmax(q_r @ key_r.transpose(1, 2) / math.sqrt(head_dim), dim=-1)
            self.profiles[r].append(weights.mean(dim=1))  # [H, Lr]
        return out


def elastic_context(mask, positions, rotary_dim, theta, inputs: ElasticInputs, *, rows, cache, real_from,
                    n_layers: int) -> ElasticContext:
    ctx = ElasticContext.build(mask, positions, rotary_dim, theta, mode="dkv", rows=rows, cache=cache,
                               real_from=real_from, columns=inputs.columns)
    ctx.mode = "elastic"
    ctx.targets, ctx.window = inputs.window, inputs.window
    ctx.refresh_from, ctx.rotary_dim, ctx.theta = inputs.refresh_from, rotary_dim, theta
    ctx.profiles = [[] for _ in range(mask.shape[0])]
    n, L = inputs.columns.shape[1], mask.shape[1]
    deep = max(n_layers - inputs.refresh_from, 0)
    inputs.computed_pairs = (n_layers - deep) * n + deep * L
    return ctx


@torch.no_grad()
def forward_elastic(lm, ids, cache, inputs: ElasticInputs, rows=None, real_from: list[int] | None = None) -> torch.Tensor:
    """DiffusionLM.forward_elastic (mode "elastic"): float32 logits [R, k, V] of ``inputs.window`` of the
    selected rows of the canvas ``ids`` [B, L]; fills ``inputs.profiles`` and ``inputs.computed_pairs``.
    The cache must hold every layer's input hidden states (new_cache(..., every_layer=True))."""
    r = slice(None) if rows is None else rows
    c = lm.config
    ctx = elastic_context(cache.attention_mask[r], cache.positions[r], c.rotary_dim, c.rope_theta, inputs,
                          rows=rows, cache=cache, real_from=real_from, n_layers=c.n_layers)
    logits = lm.model(ids[r].gather(1, inputs.columns), ctx)
    inputs.profiles = ctx.profiles
    return logits
