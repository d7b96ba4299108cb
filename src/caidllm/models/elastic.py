"""Elastic-Cache's forward (mode "elastic"): Nguyen-Tri, Ranjan and Shen, "Attention Is All You Need
for KV Cache in Diffusion LLMs" (arXiv 2510.14973; official code VILA-Lab/Elastic-Cache, its
LLaDABlock.attention in llada/model/modeling_llada.py; decode/elastic.py for the loop).

A forward computes only some columns of each row (``columns``); every other column's K/V and query
are read from the cache. At each layer below the refresh it runs the drift test on the tracked tokens:
each one's attention over the row's keys with its cached query against the keys cached before this
step, and with its fresh query against the updated keys (softmax of q.k / sqrt(head_dim)), their cosine
similarity over heads, averaged over tokens and keys; below ``gamma``, every deeper layer of this same
forward computes every column: its input there is the hidden state the cache holds for that layer, the
computed columns' fresh one where they were computed, and the K/V, queries and hidden states are written
back. At every layer it also names the keys the ``profiled`` queries attend to most (summed over heads
and queries, ``untrackable`` keys left out): the next step's tracked tokens.

The rows of one forward share the refresh: the engine runs each elastic request alone, so that one
row's drift never refreshes another's cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .layers import Context, apply_rope, positions_from_mask, rope_cos_sin


@dataclass
class ElasticInputs:
    """One elastic forward's columns, for R rows with equal counts (absolute canvas columns, ascending).

    columns: [R, n] computed from the first layer; window: [R, k] the columns whose logits come back
    (in this order); refresh_from: the first layer computed over every column unless the drift test
    names an earlier one (n_layers: none). profiled: [R, p] the queries whose attention names the
    tracked tokens (None: the window); tracked: per row, the absolute columns the drift test watches;
    untrackable: per row, absolute columns never tracked (still-masked positions).
    After the forward: ``refresh_from`` is the layer the refresh started at, ``tracked`` per row the
    next step's most-attended columns (absolute, ascending)."""

    columns: torch.Tensor
    window: torch.Tensor
    refresh_from: int
    block_at: torch.Tensor | None = (
        None  # [R, block] index of each block position in `window` (0 where it is not)
    )
    profiled: torch.Tensor | None = None
    tracked: list[list[int]] = field(default_factory=list)
    untrackable: list[list[int]] = field(default_factory=list)
    gamma: float = 0.9
    track: int = 1  # most-attended keys named per layer (the official track_num)
    test_from: int = 0  # the shallowest layer the drift test runs at
    firsts: list[int] = field(default_factory=list)  # the caller's: each row's first real column
    whole: bool = (
        False  # every column computed (a request's first forward): the rows' mask goes into the cache
    )
    computed_pairs: int = 0


@dataclass
class ElasticContext(Context):
    """A Context over chosen columns that widens to the whole canvas at ``refresh_from``."""

    refresh_from: int = 0
    rotary_dim: int = 0
    theta: float = 0.0
    inputs: ElasticInputs | None = None
    named: list[set[int]] | None = None  # per row, the keys named so far (relative to its first real column)

    def enter(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        if layer == self.refresh_from and self.index.shape[1] < self.mask.shape[1]:
            x = self._widen(layer, x)
        return super().enter(layer, x)

    def _widen(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Every column from here on: the cached inputs of this layer, with the computed columns' fresh
        ones."""
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

    def _first(self, r: int) -> int:
        return self.real_from[r] if self.real_from is not None else 0

    def attend(self, layer: int, q, k, v, head_dim: int, rope_fp32: bool) -> torch.Tensor:
        R, n, _ = q.shape
        # [R, H, n, hd]
        queries = apply_rope(q.view(R, n, -1, head_dim).transpose(1, 2), self.cos, self.sin, rope_fp32)
        testing = layer < self.refresh_from and layer >= self.inputs.test_from
        before = [self._cached_attention(r, layer) if testing else None for r in range(R)]
        out = super().attend(layer, q, k, v, head_dim, rope_fp32)  # writes the computed columns' K/V first
        self.cache.queries[layer][self.row_ids, :, self.index] = queries.transpose(1, 2)
        drifted = False
        for r in range(
            R
        ):  # each row alone over its own real keys: its numbers never depend on its neighbours
            if before[r] is not None:
                drifted |= self._similarity(r, layer, before[r]) < self.inputs.gamma
            self._name_most_attended(r, layer)
        if drifted:
            self.refresh_from = layer + 1
        return out

    def _attention(self, r: int, layer: int, q_r: torch.Tensor) -> torch.Tensor:
        """softmax(q.k / sqrt(hd)) of queries [H, t, hd] over row r's real keys as cached now: [H, t, Lr]."""
        key_r = self.cache.keys[layer][self.row_ids[r, 0], :, self._first(r) :].float()
        key_r = key_r.repeat_interleave(q_r.shape[0] // key_r.shape[0], dim=0)
        return torch.softmax(q_r.float() @ key_r.transpose(1, 2) / math.sqrt(q_r.shape[-1]), dim=-1)

    def _cached_attention(self, r: int, layer: int) -> torch.Tensor | None:
        """The tracked tokens' attention before this step's writes: cached queries over cached keys."""
        tracked = self.inputs.tracked[r] if r < len(self.inputs.tracked) else []
        if not tracked:
            return None
        at = torch.tensor(tracked, device=self.mask.device)
        return self._attention(r, layer, self.cache.queries[layer][self.row_ids[r, 0], :, at])

    def _similarity(self, r: int, layer: int, before: torch.Tensor) -> float:
        """Cosine over heads of the tracked tokens' attention before and now, averaged over tokens and
        keys."""
        at = torch.tensor(self.inputs.tracked[r], device=self.mask.device)
        now = self._attention(r, layer, self.cache.queries[layer][self.row_ids[r, 0], :, at])
        return float(torch.nn.functional.cosine_similarity(before, now, dim=0).mean())

    def _name_most_attended(self, r: int, layer: int) -> None:
        profiled = self.inputs.profiled if self.inputs.profiled is not None else self.targets
        q_r = self.cache.queries[layer][self.row_ids[r, 0], :, profiled[r]]  # [H, p, hd], just written
        weight = self._attention(r, layer, q_r).sum(dim=(0, 1))  # [Lr]
        first = self._first(r)
        left_out = [
            c - first for c in (self.inputs.untrackable[r] if r < len(self.inputs.untrackable) else [])
        ]
        if left_out:
            weight[torch.tensor(left_out, device=weight.device)] = 0.0
        top = weight.topk(min(self.inputs.track, weight.shape[0])).indices
        self.named[r].update(int(c) for c in top)


def elastic_context(
    mask, positions, rotary_dim, theta, inputs: ElasticInputs, *, rows, cache, real_from
) -> ElasticContext:
    ctx = ElasticContext.build(
        mask,
        positions,
        rotary_dim,
        theta,
        index=inputs.columns,
        targets=inputs.window,
        rows=rows,
        cache=cache,
        real_from=real_from,
        refresh_from=inputs.refresh_from,
        inputs=inputs,
        named=[set() for _ in range(mask.shape[0])],
    )
    # for widening to the whole canvas (build's own are its arguments)
    ctx.rotary_dim, ctx.theta = (
        rotary_dim,
        theta,
    )
    return ctx


@torch.no_grad()
def forward_elastic(
    lm,
    ids,
    cache,
    inputs: ElasticInputs,
    rows=None,
    real_from: list[int] | None = None,
    mask: torch.Tensor | None = None,
    key_end: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Elastic mode's forward (models/modes/elastic.py): float32 logits [R, k, V] of ``inputs.window`` of
    the selected rows of the canvas ``ids`` [B, L]; sets ``inputs.refresh_from``, ``inputs.tracked`` and
    ``inputs.computed_pairs``. The cache must hold every layer's input hidden states and queries
    (new_cache(..., every_layer=True)). ``mask`` [B, L] (True = real token): given, the rows' mask and
    positions are written into the cache first (a request's first forward, which computes every column).
    ``key_end`` [R] long: each row's keys from that column on hidden (layers.Context.key_end)."""
    r = slice(None) if rows is None else rows
    c = lm.config
    if mask is not None:
        cache.attention_mask[r] = mask[r]
        cache.positions[r] = positions_from_mask(mask[r])
        cache.filled[r] = True
    ctx = elastic_context(
        cache.attention_mask[r],
        cache.positions[r],
        c.rotary_dim,
        c.rope_theta,
        inputs,
        rows=rows,
        cache=cache,
        real_from=real_from,
    )
    ctx.key_end = key_end
    n = inputs.columns.shape[1]
    logits = lm.model(ids[r].gather(1, inputs.columns), ctx)
    deep = max(c.n_layers - ctx.refresh_from, 0) if n < ids.shape[1] else 0
    inputs.computed_pairs = (c.n_layers - deep) * n + deep * ids.shape[1]
    inputs.refresh_from = ctx.refresh_from
    inputs.tracked = [sorted(ctx._first(i) + col for col in named) for i, named in enumerate(ctx.named)]
    return logits
