"""Pieces shared by every family: RMSNorm, RoPE, SwiGLU and attention over a
(possibly cached) canvas: bidirectional, or block-causal for block-diffusion
models (``Context.attention_block``).

The two families name their parameters differently, so each model file owns
its Linear layers (with the official names) and calls these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import RowGroups, cache_rows, sdpa
from .cache import KVCache


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32 (bf16 sums of squares lose too much), cast back, then scale.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return x32.to(x.dtype) * weight


def swiglu_weights(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


class RMSNorm(nn.Module):
    # The function that computes it; models/compiled.py swaps in a compiled one per instance.
    kernel = staticmethod(rms_norm)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.weight, self.eps)


def swiglu(
    x: torch.Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear, kernel=swiglu_weights
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)); `kernel` computes it from the weights (compiled.py may compile it)."""
    return kernel(x, gate.weight, up.weight, down.weight)


def logits_at_targets(ctx: Context, x: torch.Tensor, norm: nn.Module, head: torch.Tensor) -> torch.Tensor:
    """Float32 logits of the final hidden states x at ``ctx.targets`` (every computed position when
    None), for a model without Dream's shift: only there, since the head over a large vocabulary
    is the costly part."""
    offsets = ctx.target_offsets()
    if offsets is not None:
        x = x.gather(1, offsets[..., None].expand(-1, -1, x.shape[-1]))
    return F.linear(norm(x), head).float()


def default_attention_block(config) -> int | None:
    """The attention block length of a forward that names none: None (bidirectional) for a
    full-sequence model, else the first block length the model decodes with (32 when the
    config allows any, LLaDA2's default)."""
    if not config.block_causal:
        return None
    return config.block_lengths[0] if config.block_lengths else 32


def block_visibility(query_positions: torch.Tensor, key_positions: torch.Tensor, block: int) -> torch.Tensor:
    """Block-causal attention: [R, 1, n, L] bool, True where a query may read a key. Blocks
    are laid from position 0 (the first real token); a position sees its own block and
    every earlier one, never a later one."""
    return (key_positions // block)[:, None, None, :] <= (query_positions // block)[:, None, :, None]


def causal_within(
    visible: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, span: torch.Tensor
) -> torch.Tensor:
    """``visible`` [R, 1, n, L] with the queries at positions in [span[:, 0], span[:, 1]) reading every key
    at a position up to their own, and no other (token-causal attention)."""
    q = query_positions[:, None, :, None]
    inside = (q >= span[:, 0, None, None, None]) & (q < span[:, 1, None, None, None])
    return torch.where(inside, key_positions[:, None, None, :] <= q, visible)


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """RoPE positions of a left-padded canvas: the first real token is 0, padding is 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [R, 1, n, head_dim] in fp32 for positions [R, n] (head_dim: the
    dimensions rotated, fewer than a head's with partial rotary embeddings)."""
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
    rotated = cos.shape[-1]
    if rotated < x.shape[-1]:  # partial rotary (LLaDA2): the last dimensions pass through unrotated
        return torch.cat([apply_rope(x[..., :rotated], cos, sin, fp32), x[..., rotated:]], dim=-1)
    if fp32:
        x32 = x.float()
        return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


@dataclass
class Context:
    """What one forward pass computes and where its keys come from, described by data: the forward
    modes (models/modes/) decide these, this class names none of them.

    Keys always span the whole canvas [0, L). Computed positions: ``index`` [R, n] (absolute columns,
    ascending per row; their fresh K/V are written into the cache, every other column's read from it),
    or, when ``index`` is None, [lo, L) shared by every row: without ``reads_cache`` every K/V is fresh
    (written to ``cache`` if one is given: a refresh); with it, each row reads the K/V left of its own
    block start (``fresh_from``) from the cache's working copy, and its fresh K/V are written there from
    that start on (never read before the next refresh: the prefix is read in place, never concatenated).
    Rows may sit at different block starts in one forward (the step-level engine batches requests at
    different blocks); ``targets`` are the absolute columns whose logits are returned, [R, block].
    The model calls ``enter`` with the input of each layer and ``leave`` with the last layer's output
    (level n_layers): they keep the cache's hidden states (unless ``keeps_hidden`` is off); a mode that
    drops positions at some layers subclasses them (in its own module of models/modes/).
    """

    lo: int  # index None: the computed positions are [lo, L), shared by every row
    rows: torch.Tensor | slice  # rows of the batch / cache: a slice (a view) or a long tensor
    mask: torch.Tensor  # [R, L] bool, True = real token (key padding mask)
    cos: torch.Tensor  # [R, 1, n, head_dim] fp32, n = positions computed at the current layer
    sin: torch.Tensor
    reads_cache: bool = False  # K/V of positions not computed come from the cache (False: a full forward)
    keeps_hidden: bool = True  # the layers' inputs go into the cache's hidden states where it keeps them
    # The model's logit shift counts among the computed positions only (a sub-block forward: each position
    # reads the hidden state of the one before it among them, the first its own; models/fastdllm_v2.py).
    shift_within_computed: bool = False
    cache: KVCache | None = None
    key_mask: torch.Tensor | None = None  # [R, 1, 1, L]; None only for the training forward (whole_canvas)
    targets: torch.Tensor | None = (
        None  # [R, block] absolute columns to return logits for; None = all computed
    )
    index: torch.Tensor | None = None  # [R, n] absolute columns computed at the current layer
    fresh_from: torch.Tensor | None = (
        None  # reading the prefix, rows at different starts: [R] first fresh column
    )
    extra: int = 0  # positions left of the block computed for it (Dream's start-1)
    # Left-padded rows: each row's first real column. Attention then runs over each row's own
    # real keys, unmasked, so a row's numbers do not depend on how much padding the batch gives it.
    real_from: list[int] | None = None
    # Block-causal models: the attention block length (None: bidirectional), and the RoPE
    # positions [R, L] of the rows, from which each query's and key's block is read.
    attention_block: int | None = None
    positions: torch.Tensor | None = None
    # [R] long: each row's keys from this column on are hidden from every query (None: none are), as if
    # the canvas ended there (a policy whose forwards may end early: PolicySettings.horizon).
    key_end: torch.Tensor | None = None
    # [R, 2] long: each row's queries at RoPE positions in [lo, hi) read their keys token-causally (every
    # key at a position up to their own) instead of block-causally (None: none do): S2D2's AR-like caching
    # (decode/policies/s2d2_ar.py).
    causal_span: torch.Tensor | None = None

    def __post_init__(self):
        # The key mask serves rows whose padding is not all on the left (a caller's own canvas);
        # left-padded rows (every decode) attend over their real keys only (attention.RowGroups).
        if self.key_mask is None:
            self.key_mask = self.mask[:, None, None, :]
        self.computed = self.index  # the columns computed at the first layer
        self._row_groups = None
        self.memo: dict = {}  # what layers derive from the context once per forward (block routing's blocks)

    @classmethod
    def whole_canvas(
        cls, ids: torch.Tensor, head_dim: int, theta: float, attention_block: int | None = None
    ) -> Context:
        """Every position of ``ids``, no padding, no cache (as in training)."""
        mask = torch.ones_like(ids, dtype=torch.bool)
        ctx = cls.build(mask, positions_from_mask(mask), head_dim, theta, attention_block=attention_block)
        ctx.key_mask = None  # no padding and no batch to stay invariant to: let SDPA pick its fastest kernel
        return ctx

    @classmethod
    def explicit(
        cls, positions: torch.Tensor, attention: torch.Tensor, head_dim: int, theta: float
    ) -> Context:
        """Every position of the input, no cache, each with its own RoPE position and an
        explicit mask: ``attention`` [R, n, n] bool, True where query i may see key j.
        Block-diffusion training uses it: the noisy and the clean copy of a sequence side
        by side (2L tokens, the same positions twice, train/block_diffusion.py)."""
        ctx = cls.build(torch.ones_like(positions, dtype=torch.bool), positions, head_dim, theta)
        ctx.key_mask = attention[:, None]
        return ctx

    @classmethod
    def build(
        cls,
        mask,
        positions,
        head_dim,
        theta,
        *,
        index=None,
        lo=0,
        targets=None,
        fresh_from=None,
        reads_cache=None,
        rows=None,
        cache=None,
        real_from=None,
        attention_block=None,
        **options,
    ):
        """mask, positions: [R, L] of the selected rows; index: [R, n] the computed columns (None: [lo, L));
        targets: [R, block] the columns whose logits come back (None: every computed one); reads_cache:
        None = whether index is given; attention_block: the block length of block-causal attention (None:
        bidirectional); options: the remaining fields (extra, keeps_hidden, shift_within_computed, ...)."""
        rows = slice(None) if rows is None else rows
        computed = positions[:, lo:] if index is None else positions.gather(1, index)
        cos, sin = rope_cos_sin(computed, head_dim, theta)
        reads_cache = index is not None if reads_cache is None else reads_cache
        return cls(
            lo,
            rows,
            mask,
            cos,
            sin,
            reads_cache=reads_cache,
            cache=cache,
            targets=targets,
            index=index,
            fresh_from=fresh_from,
            real_from=real_from,
            attention_block=attention_block,
            positions=positions,
            **options,
        )

    @property
    def row_ids(self) -> torch.Tensor:
        """[R, 1] absolute row of each computed row, for indexing the cache."""
        if isinstance(self.rows, slice):
            first = self.rows.start or 0
            return torch.arange(first, first + self.mask.shape[0], device=self.mask.device)[:, None]
        return self.rows[:, None]

    @property
    def row_groups(self) -> RowGroups:
        """The rows grouped by left padding, built at the first layer and kept for the others."""
        if self._row_groups is None:
            self._row_groups = RowGroups(
                self.real_from, self.lo, self.index is not None, self.rows, self.mask.device
            )
        return self._row_groups

    def target_offsets(self) -> torch.Tensor | None:
        """[R, block] index of each target among the computed positions (None: all of them)."""
        if self.targets is None:
            return None
        first = self.lo if self.computed is None else self.computed[:, :1]
        return self.targets - first

    def computed_columns(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(RoPE positions, real) [R, n] of the positions computed at the current layer."""
        if self.index is None:
            return self.positions[:, self.lo :], self.mask[:, self.lo :]
        return self.positions.gather(1, self.index), self.mask.gather(1, self.index)

    def computed_offsets(self, absolute: torch.Tensor) -> torch.Tensor:
        """Absolute columns [R, k] as indices among the computed positions."""
        return absolute - (self.lo if self.computed is None else self.computed[:, :1])

    # ---- hidden states ------------------------------------------------

    def enter(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x: input of `layer` at the computed positions. Returns the input for the positions that run
        it (all of them here; a mode that drops positions overrides this)."""
        self._store_hidden(layer, x)
        return x

    def leave(self, level: int, x: torch.Tensor) -> torch.Tensor:
        """x: output of the last layer (level = n_layers). Returns the final hidden states of every
        computed position."""
        self._store_hidden(level, x)
        return x

    def _store_hidden(self, level: int, x: torch.Tensor) -> None:
        c = self.cache
        if c is None or level not in c.hidden or not self.keeps_hidden:
            return
        if self.index is None:
            c.hidden[level][self.rows, self.lo :] = x
        else:
            c.hidden[level][self.row_ids, self.index] = x

    # ---- attention ------------------------------------------------------

    def attend(self, layer: int, q, k, v, head_dim: int, rope_fp32: bool) -> torch.Tensor:
        """Attention for the computed positions. q, k, v: [R, n, heads*head_dim]."""
        R, n, _ = q.shape
        q = q.view(R, n, -1, head_dim).transpose(1, 2)  # [R, H, n, hd]
        k = k.view(R, n, -1, head_dim).transpose(1, 2)  # [R, Hkv, n, hd]
        v = v.view(R, n, -1, head_dim).transpose(1, 2)
        q = apply_rope(q, self.cos, self.sin, rope_fp32)
        k = apply_rope(k, self.cos, self.sin, rope_fp32)

        c, rows = self.cache, self.rows
        from_cache = self.reads_cache  # the layer's cache is read, written in place first
        if not from_cache:
            keys, values = k, v
            for cached_k, cached_v in c.layer_tensors(layer) if c is not None else ():
                cached_k[rows] = k
                cached_v[rows] = v
        elif self.index is None:
            work_keys, work_values = c.working_copy()
            keys, values = self._write_fresh(work_keys[layer], k), self._write_fresh(work_values[layer], v)
        else:
            # Each row writes its own columns; indexing [rows, :, columns] puts them first: [R, n, Hkv, hd].
            for cached_k, cached_v in c.layer_tensors(layer):
                cached_k[self.row_ids, :, self.index] = k.transpose(1, 2)
                cached_v[self.row_ids, :, self.index] = v.transpose(1, 2)
            keys, values = c.keys[layer], c.values[layer]

        # Bidirectional: no mask. Left-padded rows attend over their real keys only, unmasked.
        # Block-causal: the same, with each query's later blocks hidden.
        visible = self._block_visibility()
        if self.real_from is not None:
            out = self.row_groups.attend(q, keys, values, from_cache, rows, visible)
        else:
            if from_cache:
                keys, values = cache_rows(keys, rows), cache_rows(values, rows)
            mask = self.key_mask
            if visible is not None:
                mask = visible if mask is None else mask & visible
            out = sdpa(q, keys, values, mask)
        return out.transpose(1, 2).reshape(R, n, -1)

    def _block_visibility(self) -> torch.Tensor | None:
        """[R, 1, n, L] which keys the positions computed at this layer read (None: every one): the
        block-causal mask, and each row's keys cut at its key_end (both where both apply)."""
        ends = None
        if self.key_end is not None:
            L, n = self.mask.shape[1], self.cos.shape[2]
            ends = (
                torch.arange(L, device=self.mask.device)[None, None, None, :]
                < self.key_end[:, None, None, None]
            )
            ends = ends.expand(-1, 1, n, L)
        if self.attention_block is None:
            return ends
        if self.index is None:
            queries = self.positions[:, self.lo :]
        else:
            queries = self.positions.gather(1, self.index)
        visible = block_visibility(queries, self.positions, self.attention_block)
        if self.causal_span is not None:
            visible = causal_within(visible, queries, self.positions, self.causal_span)
        return visible if ends is None else visible & ends

    def _write_fresh(self, cached: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
        """Reading the prefix: write the fresh K/V of columns [lo, L) into the layer's working copy,
        except where a row whose block starts right of lo keeps its cached entries up to its
        own start (as it would alone); returns it: it now holds every key to read. Safe: a
        prefix forward reads only left of each row's own start, never what it wrote."""
        rows, lo = self.rows, self.lo
        if self.fresh_from is not None:
            columns = lo + torch.arange(fresh.shape[2], device=fresh.device)
            from_cache = (columns < self.fresh_from[:, None])[:, None, :, None]  # [R, 1, n, 1]
            fresh = torch.where(from_cache, cached[rows, :, lo:], fresh)
        cached[rows, :, lo:] = fresh
        return cached
