"""What every forward mode shares: the base of the mode objects, the resolved inputs of one
call, and the canvas forward the cached modes (prefix, dual, es, block) and the full one run.

A mode object is a typed spec: its fields are the inputs of that mode only (a field of another
mode is a TypeError naming it). ``DiffusionLM.forward(ids, mask, cache, mode)`` resolves it
(``resolve``: the argument checks, unless the caller vouches with ``real_from``) and runs it
(``run``). The engine builds one per forward group from its requests (``for_rows``), groups
rows by ``group_key`` and reads the rest of the class attributes; ``requests`` there are the
engine's (decode/request.py), read only through the attributes each mode names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ...errors import InputError
from ..cache import KVCache
from ..layers import Context, default_attention_block
from ..transfer import to_device
from .checks import (
    check_attention_block,
    check_cache,
    check_canvas,
    check_filled,
    check_key_end,
    check_range,
    check_rows,
    left_padding,
)


@dataclass
class Call:
    """One forward's resolved inputs: the [B, L] canvas on the model's device, the selected rows
    (None: all, a slice or a long tensor), each row's block start and the shared block length, each
    row's first real column (None: rows not all left-padded) and the attention block length."""

    ids: torch.Tensor
    mask: torch.Tensor
    cache: KVCache | None
    rows: Any
    starts: list[int]
    length: int
    real_from: list[int] | None
    attention_block: int | None

    @property
    def r(self):
        return slice(None) if self.rows is None else self.rows


@dataclass(kw_only=True)
class ForwardMode:
    """A forward's mode and its inputs. start / end: the block [start, end) whose logits come back
    (ints, or one per selected row with the same end - start); rows: the rows of the batch (None: all);
    attention_block: block-causal models' attention block length (None: the model's default);
    real_from: each selected row's first real column, given only by a caller that checked its
    inputs once and vouches for them (the engine): the checks and their host syncs are skipped
    (start / end must then be lists); key_end: [R] long, each row's keys from that column on hidden
    (SlowFast's fast phase; every mode but Verify)."""

    name: ClassVar[str]
    uses_cache: ClassVar[bool] = True  # reads a cache a full forward filled
    shadow: ClassVar[bool] = False  # returns the block's logits, then a verifying shadow block's
    unshifted: ClassVar[bool] = False  # needs logits aligned to positions (no family shift)
    bidirectional: ClassVar[bool] = False  # its computation has no block-causal mask (refuses such models)
    # The model's logit shift counts among the computed positions only (layers.Context.shift_within_computed).
    shift_within_computed: ClassVar[bool] = False

    start: int | list[int] = 0
    end: int | list[int] | None = None
    rows: Any = None
    attention_block: int | None = None
    real_from: list[int] | None = None
    key_end: torch.Tensor | None = None
    # [R, 2] long: each row's queries at RoPE positions in [lo, hi) attend token-causally (layers.Context.
    # causal_span; S2D2's AR-like caching); None: none do.
    causal_span: torch.Tensor | None = None

    # ---- model side ------------------------------------------------------

    def resolve(self, lm, ids, mask, cache) -> Call:
        if self.real_from is None:
            return self.check(lm, ids, mask, cache)
        block = self.attention_block or default_attention_block(lm.config)
        return Call(
            ids, mask, cache, self.rows, self.start, self.end[0] - self.start[0], self.real_from, block
        )

    def check(self, lm, ids, mask, cache) -> Call:
        """The public forward's checks: the canvas, rows, range and cache, then the mode's own."""
        block = check_attention_block(lm.config, self.attention_block)
        self.check_model(lm)
        ids, mask = check_canvas(lm, ids, mask)
        B, L = ids.shape
        rows = check_rows(lm, self.rows, B)
        starts, length = check_range(self.start, self.end, L, B if rows is None else len(rows))
        extra = self.extra(lm)
        if min(starts) < extra:
            raise InputError(
                f"mode {self.name!r}: start must be >= {extra} for this model (it predicts position "
                f"start from the hidden state of start - 1); got start={min(starts)}"
            )
        if cache is not None:
            check_cache(lm, cache, B, L)
        if self.uses_cache:
            check_filled(self.name, cache, mask, rows)
        self.key_end = check_key_end(lm, self.key_end, len(starts))
        call = Call(
            ids,
            mask,
            cache,
            rows,
            starts,
            length,
            left_padding(mask[slice(None) if rows is None else rows]),
            block,
        )
        self.check_inputs(lm, call)
        return call

    def check_model(self, lm) -> None:
        """Refuse a model this mode cannot run on (naming both)."""
        if self.unshifted and lm.model.extra_left:
            raise InputError(
                f"the {self.name} forward needs unshifted logits; family {lm.config.family!r} "
                "predicts position i from i - 1"
            )
        if self.bidirectional and lm.config.block_causal:
            raise InputError(
                f"the {self.name} forward needs bidirectional attention; the {lm.config.family} model "
                "is block-causal"
            )

    def check_inputs(self, lm, call: Call) -> None:
        """The mode's own inputs, against the resolved call."""

    def extra(self, lm) -> int:
        """Positions left of the block computed for it (Dream's start - 1)."""
        return lm.model.extra_left

    def run(self, lm, call: Call) -> torch.Tensor:
        raise NotImplementedError

    def computed_positions(self, call: Call, starts: torch.Tensor, extra: int) -> dict:
        """What the forward computes, as layers.Context.build's keywords: here each row's block and the
        ``extra`` positions left of it, against the cache (``index``); a mode over a range overrides it."""
        return dict(index=block_columns(starts, call.length, extra))

    # ---- engine side -----------------------------------------------------

    @staticmethod
    def group_key(request) -> tuple:
        """Beyond the mode and the block length, rows share one forward only when these are equal."""
        return ()

    @classmethod
    def for_rows(cls, requests: list, masked: torch.Tensor, starts: list[int], **common) -> ForwardMode:
        """The mode object of one forward group: `common` are the base fields (start, end, rows,
        attention_block, real_from, key_end); masked [R, block] which block positions are masks."""
        return cls(**common)

    def after(self, requests: list) -> None:
        """What the requests keep from the forward once it ran."""

    def computed_pairs(self, n_layers: int, block_length: int) -> int:
        """(layer, block position) pairs the forward computed for each row."""
        return n_layers * block_length


@dataclass(kw_only=True)
class CachedCanvasMode(ForwardMode):
    """A mode whose Context (layers.Context) computes the block (and ``extra`` positions left of it) and
    reads every other position's K/V, mask and positions from the cache."""

    def run(self, lm, call: Call) -> torch.Tensor:
        return cached_forward(lm, call, self, self.extra(lm))[0]


@dataclass(kw_only=True)
class ColumnsMode(ForwardMode):
    """A mode over chosen columns of each row (dkv, subblock): ``columns`` [R, n] (absolute, ascending
    per row) computed, their K/V written into the cache, every other column's read from it; logits
    [R, n, V] of the columns, or with ``block_at`` [R, block] (each block position's index among them)
    of the block."""

    columns: torch.Tensor | None = None
    block_at: torch.Tensor | None = None

    def check_inputs(self, lm, call: Call) -> None:
        columns = self.columns
        if not isinstance(columns, torch.Tensor) or columns.dim() != 2 or columns.dtype.is_floating_point:
            raise InputError(
                f"mode {self.name!r} needs columns=[R, n] long tensor, got {_described(columns)}"
            )
        rows, L = len(call.starts), call.ids.shape[1]
        if columns.shape[0] != rows or columns.shape[1] == 0:
            raise InputError(
                f"mode {self.name!r}: columns has {columns.shape[0]} rows for {rows} selected rows "
                f"(and needs at least one column), shape {tuple(columns.shape)}"
            )
        if (bad := _outside(columns, L)) is not None:
            raise InputError(f"mode {self.name!r}: columns must lie in [0, {L}), got {bad}")
        if bool((columns[:, 1:] <= columns[:, :-1]).any()):
            raise InputError(
                f"mode {self.name!r}: columns must be ascending in each row, got {columns.tolist()}"
            )
        self.columns = columns.to(lm.device, torch.long)
        if self.block_at is not None:
            n, block_at = columns.shape[1], self.block_at
            if (
                not isinstance(block_at, torch.Tensor)
                or block_at.dim() != 2
                or block_at.shape[0] != rows
                or block_at.dtype.is_floating_point
            ):
                raise InputError(
                    f"mode {self.name!r} needs block_at=[R, block] long tensor, got {_described(block_at)}"
                )
            if (bad := _outside(block_at, n)) is not None:
                raise InputError(
                    f"mode {self.name!r}: block_at must index the {n} columns (0 .. {n - 1}), got {bad}"
                )
            self.block_at = block_at.to(lm.device, torch.long)

    def extra(self, lm) -> int:
        return 0

    def run(self, lm, call: Call) -> torch.Tensor:
        self.check_model(lm)  # the engine refuses these models before; a vouched call is checked here too
        c, r = lm.config, call.r
        ctx = Context.build(
            call.cache.attention_mask[r],
            call.cache.positions[r],
            c.rotary_dim,
            c.rope_theta,
            index=self.columns,
            rows=call.rows,
            cache=call.cache,
            real_from=call.real_from,
            attention_block=call.attention_block,
            key_end=self.key_end,
            causal_span=self.causal_span,
            shift_within_computed=self.shift_within_computed,
        )
        return gather_block(lm.model(call.ids[r].gather(1, self.columns), ctx), self.block_at)


def _outside(values: torch.Tensor, n: int) -> int | None:
    """A value of ``values`` outside [0, n), if any."""
    low, high = int(values.min()), int(values.max())
    return high if high >= n else low if low < 0 else None


def _described(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"dtype {value.dtype}, shape {tuple(value.shape)}"
    return type(value).__name__


def block_columns(starts: torch.Tensor, length: int, extra: int) -> torch.Tensor:
    """[R, extra + length] absolute columns of each row's block and the `extra` positions left of it."""
    return starts[:, None] - extra + torch.arange(length + extra, device=starts.device)


def canvas_forward(
    lm, call: Call, mode: ForwardMode, extra: int, mask_r, positions_r, *, context=Context, **options
):
    """The model over the canvas computing what ``mode.computed_positions`` names (a layers.Context, or the
    mode's own subclass `context` with its `options`): logits of each row's block, and the Context."""
    c = lm.config
    start_t = to_device(call.starts, lm.device)
    targets = start_t[:, None] + torch.arange(call.length, device=lm.device)
    ctx = context.build(
        mask_r,
        positions_r,
        c.rotary_dim,
        c.rope_theta,
        targets=targets,
        extra=extra,
        rows=call.rows,
        cache=call.cache,
        real_from=call.real_from,
        attention_block=call.attention_block,
        key_end=mode.key_end,
        causal_span=mode.causal_span,
        **mode.computed_positions(call, start_t, extra),
        **options,
    )
    ids = call.ids[call.r]
    computed = ids.gather(1, ctx.index) if ctx.index is not None else ids[:, ctx.lo :]
    return lm.model(computed, ctx), ctx


def cached_forward(lm, call: Call, mode: ForwardMode, extra: int, **options):
    """A forward that reads every position it does not compute from the cache (mask and positions too)."""
    r = call.r
    return canvas_forward(
        lm, call, mode, extra, call.cache.attention_mask[r], call.cache.positions[r], **options
    )


def gather_block(logits: torch.Tensor, block_at: torch.Tensor | None) -> torch.Tensor:
    """The logits of each block position: block_at [R, block] its index among the computed ones."""
    if block_at is None:
        return logits
    return logits.gather(1, block_at[..., None].expand(-1, -1, logits.shape[-1]))
