"""The checks of a public forward's canvas, rows, range and cache (DiffusionLM.forward without
``real_from``): each names what is wrong. The engine checks its requests once at submit and
vouches for its forwards, which then skip these (and their host syncs)."""

from __future__ import annotations

import operator

import torch

from ...errors import InputError
from ..cache import KVCache
from ..layers import default_attention_block


def check_canvas(lm, input_ids, attention_mask):
    """ids [B, L] long and mask [B, L] bool (True = real token) on the model's device."""
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputError(f"input_ids must be an integer tensor [B, L]: {e}") from None
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise InputError(
            f"input_ids must be an integer tensor [B, L]; got dtype {ids.dtype}, shape {tuple(ids.shape)}"
        )
    B, L = ids.shape
    if B == 0 or L == 0:
        raise InputError(f"input_ids is empty: shape {tuple(ids.shape)}")
    if L > lm.config.max_length:
        raise InputError(f"sequence length {L} exceeds the model's max_length {lm.config.max_length}")
    ids = ids.to(lm.device, torch.long)
    V = lm.config.vocab_size
    bad = (ids < 0) | (ids >= V)
    if bool(bad.any()):
        raise InputError(f"token id {int(ids[bad][0])} is outside the vocabulary (size {V}, ids 0..{V - 1})")
    return ids, check_mask(lm, attention_mask, ids)


def check_mask(lm, attention_mask, ids):
    if attention_mask is None:
        return torch.ones_like(ids, dtype=torch.bool)
    try:
        mask = torch.as_tensor(attention_mask)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputError(f"attention_mask must be a [B, L] tensor of 0/1: {e}") from None
    if tuple(mask.shape) != tuple(ids.shape):
        raise InputError(
            f"attention_mask shape {tuple(mask.shape)} does not match input_ids shape {tuple(ids.shape)}"
        )
    mask = mask.to(lm.device) != 0
    empty = ~mask.any(dim=1)
    if bool(empty.any()):
        raise InputError(f"attention_mask row {int(empty.nonzero()[0])} has no real token")
    return mask


def check_rows(lm, rows, B):
    if rows is None:
        return None
    rows = torch.as_tensor(rows)
    if rows.dim() != 1 or rows.numel() == 0 or rows.dtype.is_floating_point or rows.dtype == torch.bool:
        raise InputError(
            f"rows must be a non-empty 1-D integer tensor; got dtype {rows.dtype}, shape {tuple(rows.shape)}"
        )
    if int(rows.min()) < 0 or int(rows.max()) >= B:
        raise InputError(f"rows {rows.tolist()} out of range for batch size {B}")
    if rows.unique().numel() != rows.numel():
        raise InputError(f"rows {rows.tolist()} contains duplicates")
    return rows.to(lm.device, torch.long)


def check_cache(lm, cache, B, L):
    if not isinstance(cache, KVCache):
        raise InputError(f"cache must be a KVCache from new_cache(), got {type(cache).__name__}")
    if (cache.batch_size, cache.length) != (B, L) or len(cache.keys) != lm.config.n_layers:
        raise InputError(
            f"cache was made for a [{cache.batch_size}, {cache.length}] canvas with {len(cache.keys)} "
            "layers; "
            f"input is [{B}, {L}] for a {lm.config.n_layers}-layer model"
        )


def check_filled(name: str, cache, mask, rows) -> None:
    """A cached forward reads K/V a full forward wrote, for the same mask."""
    r = slice(None) if rows is None else rows
    if cache is None:
        raise InputError(f"mode {name!r} needs a cache filled by a full forward; got cache=None")
    if not bool(cache.filled[r].all()):
        raise InputError(f"mode {name!r}: the cache has rows never filled by a full forward (rows={rows})")
    if not torch.equal(cache.attention_mask[r], mask[r]):
        raise InputError(f"mode {name!r}: attention_mask differs from the one the cache was filled with")


def check_key_end(lm, key_end, rows: int):
    """key_end: None, or [R] integer columns (one per selected row) moved to the model's device."""
    if key_end is None:
        return None
    if (
        not isinstance(key_end, torch.Tensor)
        or key_end.dtype.is_floating_point
        or key_end.dtype == torch.bool
        or tuple(key_end.shape) != (rows,)
    ):
        shape = tuple(key_end.shape) if isinstance(key_end, torch.Tensor) else type(key_end).__name__
        raise InputError(
            f"key_end must be a [{rows}] integer tensor (one column per selected row), got {shape}"
        )
    return key_end.to(lm.device, torch.long)


def check_attention_block(config, attention_block):
    """The block length of a block-causal model's attention (None: its default)."""
    if attention_block is None:
        return default_attention_block(config)
    if not config.block_causal:
        raise InputError(
            f"attention_block={attention_block!r}: the {config.family} model's attention is "
            "bidirectional (not block-causal)"
        )
    if not isinstance(attention_block, int) or isinstance(attention_block, bool) or attention_block < 1:
        raise InputError(f"attention_block must be a positive integer, got {attention_block!r}")
    if config.block_lengths and attention_block not in config.block_lengths:
        raise InputError(
            f"block length {attention_block} is not one this model decodes with "
            f"(allowed: {', '.join(map(str, config.block_lengths))})"
        )
    return attention_block


def left_padding(mask: torch.Tensor) -> list[int] | None:
    """Each row's first real column when every row is left-padded (real tokens
    contiguous up to the end); None otherwise (attention then uses the mask)."""
    first = (~mask).sum(dim=1)
    columns = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, columns >= first[:, None]):
        return None
    return first.tolist()


def check_range(start, end, L, rows):
    """Each selected row's block start, and the block length (the same for every row).
    start / end: ints, or one int per selected row."""
    starts, ends = (_int_list(start, rows, "start"), _int_list(L if end is None else end, rows, "end"))
    for s, e in zip(starts, ends):
        if not 0 <= s < e <= L:
            raise InputError(
                f"start={s}, end={e} out of range for canvas length {L} (need 0 <= start < end <= L)"
            )
    lengths = {e - s for s, e in zip(starts, ends)}
    if len(lengths) > 1:
        raise InputError(f"end - start must be the same for every row, got lengths {sorted(lengths)}")
    return starts, lengths.pop()


def _int_list(value, rows: int, name: str) -> list[int]:
    try:
        if isinstance(value, (list, tuple)):
            values = [operator.index(v) for v in value]
        else:
            values = [operator.index(value)] * rows
    except TypeError:
        raise InputError(
            f"{name} must be an int or a list of ints (one per selected row), got {value!r}"
        ) from None
    if len(values) != rows:
        raise InputError(f"{name} has {len(values)} values for {rows} selected rows")
    return values
