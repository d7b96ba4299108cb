"""DiffusionGemma's key/value cache and attention masks.

The encoder (causal) writes the keys and values of the prompt and of each finished canvas; the
decoder reads them and never writes. One DGCache per request (its rows all one length), so that a
request's cache never depends on its batch; ``DGCache.batch`` lines several up (right-padded, a
key-validity mask) for one batched decoder forward.

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
    def empty(cls, n_layers: int) -> "DGCache":
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
    """What a batched decoder forward reads: each layer's cached keys/values right-padded to the
    longest row, the cached length of each row (its canvas starts at that position)."""

    keys: list
    values: list
    lengths: torch.Tensor  # [B] long

    @classmethod
    def batch(cls, caches: list[DGCache]) -> "DecoderView":
        lengths = [c.length for c in caches]
        longest = max(lengths)
        keys, values = [], []
        for layer in range(len(caches[0].keys)):
            keys.append(_padded([c.keys[layer] for c in caches], longest))
            values.append(_padded([c.values[layer] for c in caches], longest))
        device = caches[0].keys[0].device
        return cls(keys, values, torch.tensor(lengths, device=device, dtype=torch.long))

    def key_mask(self, canvas: int, window: int | None) -> torch.Tensor:
        """[B, 1, 1, cached + canvas] bool: the cached keys a row's canvas sees (its own, and for a
        sliding layer only its last window - 1), then every canvas key."""
        longest = self.keys[0].shape[2] if self.keys and self.keys[0] is not None else 0
        j = torch.arange(longest, device=self.lengths.device)[None]
        seen = j < self.lengths[:, None]
        if window is not None:
            seen &= j >= self.lengths[:, None] - (window - 1)
        canvas_keys = torch.ones(seen.shape[0], canvas, dtype=torch.bool, device=seen.device)
        return torch.cat([seen, canvas_keys], dim=1)[:, None, None, :]


def _padded(tensors: list[torch.Tensor], longest: int) -> torch.Tensor:
    if len(tensors) == 1 and tensors[0].shape[2] == longest:
        return tensors[0]
    return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, longest - t.shape[2])) for t in tensors], dim=0)


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
