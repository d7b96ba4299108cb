"""KV cache for the Fast-dLLM prefix and dual cache modes, and the hidden
states the ES-dLLM early-skip mode ("es") also needs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class KVCache:
    """Preallocated keys and values of every layer for a [B, L] canvas.

    Keys are stored after RoPE (rotated), so a cached key never needs its
    position again. ``attention_mask`` and ``positions`` are those of the last
    full forward of each row; ``filled[b]`` says whether row b has had one.

    Staleness:
    - A full forward with this cache (a "refresh") writes K/V of every position
      of its rows, computed from the canvas as it was then.
    - A prefix forward reads K/V of positions [0:start) and leaves ``keys`` / ``values``
      unchanged. It attends over a working copy instead (``work_keys`` /
      ``work_values``, made at the first prefix forward, then kept equal to the cache
      by every write): its fresh K/V go there, right of each row's block start, so the
      prefix is read in place and never concatenated per step (at the cost of a second
      copy of the cache's memory while prefix forwards run).
    - A dual forward over [start:end) recomputes only those positions (Dream:
      also start-1, whose hidden state predicts position start) and overwrites
      their entries in place; every other position keeps the K/V of the last
      refresh, even if its token has changed since. So after a dual step, the
      block's entries are from the latest step and all the others (prefix and
      suffix) are from the last refresh.
    - An es forward is a dual forward in which a position may stop after some
      layer: its K/V at the later layers stay as they were (from the last step
      that ran those layers on it).

    Hidden states (only in a cache made for early skipping): ``hidden[l]`` is
    the *input* of layer l (``hidden[n_layers]``: the output of the last layer,
    before the final norm), [B, L, d], for each position as of the last forward
    that ran layer l on it (that ran the last layer, for n_layers). Only the
    levels an ES schedule reads are kept (skip.hidden_levels). A refresh writes
    every position, a dual forward the positions it computes, an es forward the
    positions that run that layer; a prefix forward writes nothing.
    """

    keys: list[torch.Tensor]  # per layer [B, n_kv_heads, L, head_dim]
    values: list[torch.Tensor]  # per layer [B, n_kv_heads, L, head_dim]
    attention_mask: torch.Tensor  # [B, L] bool, True = real token
    positions: torch.Tensor  # [B, L] long, RoPE positions
    filled: torch.Tensor  # [B] bool
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # level -> [B, L, d]
    # Elastic-Cache (mode "elastic"): every layer's queries after RoPE [B, n_heads, L, head_dim], written
    # where its forwards compute (its drift test reads the tracked tokens' cached queries).
    queries: list[torch.Tensor] | None = None
    work_keys: list[torch.Tensor] | None = None  # prefix mode's working copy (see above)
    work_values: list[torch.Tensor] | None = None

    def working_copy(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The working K/V lists of prefix mode, made from the cache the first time."""
        if self.work_keys is None:
            self.work_keys = [k.clone() for k in self.keys]
            self.work_values = [v.clone() for v in self.values]
        return self.work_keys, self.work_values

    def layer_tensors(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) of `layer` that a refresh or a dual write must update: the cache's,
        and the working copy's when there is one."""
        pairs = [(self.keys[layer], self.values[layer])]
        if self.work_keys is not None:
            pairs.append((self.work_keys[layer], self.work_values[layer]))
        return pairs

    @classmethod
    def allocate(
        cls,
        n_layers,
        batch_size,
        n_kv_heads,
        length,
        head_dim,
        device,
        dtype,
        hidden_levels=(),
        hidden_size=None,
        n_heads: int | None = None,
    ) -> KVCache:
        """n_heads: also keep every layer's queries (Elastic-Cache)."""
        shape = (batch_size, n_kv_heads, length, head_dim)
        hidden = {
            level: torch.zeros(batch_size, length, hidden_size, device=device, dtype=dtype)
            for level in hidden_levels
        }
        return cls(
            keys=[torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)],
            values=[torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)],
            attention_mask=torch.zeros(batch_size, length, device=device, dtype=torch.bool),
            positions=torch.zeros(batch_size, length, device=device, dtype=torch.long),
            filled=torch.zeros(batch_size, device=device, dtype=torch.bool),
            hidden=hidden,
            queries=None
            if n_heads is None
            else [
                torch.zeros(batch_size, n_heads, length, head_dim, device=device, dtype=dtype)
                for _ in range(n_layers)
            ],
        )

    @property
    def batch_size(self) -> int:
        return self.attention_mask.shape[0]

    @property
    def length(self) -> int:
        return self.attention_mask.shape[1]
