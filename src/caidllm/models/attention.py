"""Attention kernels of the decoding forward, fit for a GPU.

- ``sdpa``: scaled_dot_product_attention with grouped-query attention done by
  the kernel (``enable_gqa=True``, torch >= 2.5) instead of copying the K/V
  heads with repeat_interleave (bit-identical on the CPU: checked by
  tests/test_gpu_path.py).
- ``RowGroups``: the rows of a forward grouped by their first real key column
  (left padding). Each group attends over its own real keys without a mask, so
  the flash kernels apply and a row's numbers never depend on its neighbours'
  padding. The group index tensors are built once per forward, not per layer.
- ``cache_rows``: a forward's rows of a layer's K/V cache, [R, Hkv, n, hd],
  from column ``key_from`` on: a view when the rows are all the slots or a
  contiguous run of them, else an index_select of only the needed columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .transfer import to_device

GQA_KERNEL = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None):
    """Bidirectional attention; keys/values may have fewer heads than q (grouped-query:
    kv head j serves query heads j*g .. j*g+g-1)."""
    groups = q.shape[1] // keys.shape[1]
    if groups > 1 and not GQA_KERNEL:
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    elif groups > 1:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def cache_rows(t: torch.Tensor, rows, key_from: int = 0) -> torch.Tensor:
    """Rows `rows` (a slice, or a long tensor of absolute rows) of cache tensor `t`
    [B, Hkv, L, hd], columns [key_from, L)."""
    if isinstance(rows, slice):
        return t[rows, :, key_from:]
    return t[:, :, key_from:].index_select(0, rows)


class RowGroups:
    """Rows of a forward with the same first real key column and first real query
    (padding queries get zeros: they are never read)."""

    def __init__(self, real_from: list[int], lo: int, per_row_queries: bool, rows, device):
        groups: dict[tuple[int, int], list[int]] = {}
        for r, key_from in enumerate(real_from):
            query_from = 0 if per_row_queries else max(key_from - lo, 0)
            groups.setdefault((key_from, query_from), []).append(r)
        self.single = len(groups) == 1 and next(iter(groups))[1] == 0
        self.key_from = next(iter(groups))[0]
        self.lo = lo  # the forward's own keys start at column lo (the cache's at 0)
        self.groups = []
        if not self.single:
            absolute = _absolute_rows(rows, len(real_from), device)
            for (key_from, query_from), members in groups.items():
                at = to_device(members, device)
                self.groups.append((key_from, query_from, at, absolute.index_select(0, at)))

    def attend(self, q, keys, values, from_cache: bool, rows, visible=None) -> torch.Tensor:
        """q: [R, H, n, hd]; keys/values: the whole layer cache [B, Hkv, L, hd] when
        from_cache (rows pick the forward's rows), else the forward's own [R, Hkv, L, hd].
        visible: None (bidirectional), or [R, 1, n, L] bool, which keys each query may read."""
        if self.single:
            k, v = (
                cache_rows(t, rows, self.key_from) if from_cache else t[:, :, self.key_from - self.lo :]
                for t in (keys, values)
            )
            return sdpa(q, k, v, None if visible is None else visible[..., self.key_from :])
        out = q.new_zeros(q.shape)
        for key_from, query_from, at, absolute in self.groups:
            k, v = (
                cache_rows(t, absolute, key_from)
                if from_cache
                else t[:, :, key_from - self.lo :].index_select(0, at)
                for t in (keys, values)
            )
            mask = None if visible is None else visible.index_select(0, at)[:, :, query_from:, key_from:]
            out[at, :, query_from:] = sdpa(q.index_select(0, at)[:, :, query_from:], k, v, mask)
        return out


def _absolute_rows(rows, n: int, device) -> torch.Tensor:
    if isinstance(rows, slice):
        return torch.arange(rows.start or 0, (rows.start or 0) + n, device=device)
    return rows
