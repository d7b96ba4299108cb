"""DiffusionGemma's key/value cache and attention masks.

The encoder (causal) writes the keys and values of the prompt and of each finished canvas; the
decoder reads them and never writes. One DGCache per request (its rows all one length), so that a
request's cache never depends on its batch; a DecoderView holds those of one batched decoder forward.

Which cached keys the decoder sees follows transformers' dynamic cache, the reference generate()'s:
a sliding-window layer keeps only its last ``sliding_window - 1`` keys, and the canvas attends to
all of those and to the whole canvas (no window inside the canvas); a full layer sees everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DGCache:
    """keys / values per layer, [rows, kv_heads, length, head_dim]; every row `length` long."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else self.keys[0].shape[2]

    @classmethod
    def empty(cls, n_layers: int) -> DGCache:
        return cls([None] * n_layers, [None] * n_layers)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [rows, kv_heads, n, head_dim] after the layer's cached ones; returns all of them."""
        if self.keys[layer] is not None:
            k, v = torch.cat([self.keys[layer], k], dim=2), torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)


@dataclass
class DecoderView:
    """What a batched decoder forward reads: each row's own cache. Attention runs row by row over that
    row's cached keys (no padding): a row's numbers are those it gets alone, whatever its batch (the
    self-conditioning loop would grow a rounding difference into a different sample)."""

    caches: list

    @classmethod
    def batch(cls, caches: list[DGCache]) -> DecoderView:
        return cls(list(caches))

    @property
    def lengths(self) -> list[int]:
        return [c.length for c in self.caches]

    def cached(self, row: int, layer: int, window: int | None):
        """The keys / values of `row` that its canvas sees at `layer`: all of them, or for a sliding layer its
        last window - 1 (transformers' dynamic cache keeps no more)."""
        cache = self.caches[row]
        k, v = cache.keys[layer], cache.values[layer]
        if k is None or window is None:
            return k, v
        start = max(0, k.shape[2] - (window - 1))
        return k[:, :, start:], v[:, :, start:]


def causal_mask(start: int, n: int, window: int | None, device) -> torch.Tensor:
    """[1, 1, n, start + n] bool for an encoder chunk at positions start..start+n-1 over every key
    before it: causal, and within the window for a sliding layer (query q sees key k when
    q - window < k <= q)."""
    q = torch.arange(start, start + n, device=device)[:, None]
    k = torch.arange(start + n, device=device)[None]
    mask = k <= q
    if window is not None:
        mask &= k > q - window
    return mask[None, None]
