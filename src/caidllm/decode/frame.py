"""The engine's shared canvas and KV cache: one row (a slot) per in-flight request.

Each request's canvas (its prompt, then gen_length positions, masks until
committed) is right-aligned in its slot: it occupies the last L_r columns of
a frame W columns wide, padding on the left, as in a left-padded static batch.
So a request's block starts at column W - (gen_length - block * block_length)
and its K/V cache row is its own, whatever its neighbours' lengths.

The frame is as wide as the longest in-flight request. A longer request that
joins widens it, and the last long one that leaves narrows it: the rows are
moved (their cache values, positions and masks unchanged), never recomputed.
A free slot holds one dummy real token so that every row of the canvas stays
valid for the model's checks; it is never computed.
"""

from __future__ import annotations

import torch

from caidllm.models.cache import KVCache
from caidllm.models.skip import hidden_levels


class Frame:
    """The canvas, attention mask and KV cache rows of every slot, right-aligned in a frame as wide
    as the longest request in flight. The scheduler places and releases requests; the runner reads
    and writes their blocks."""

    def __init__(self, lm, slots: int):
        self.lm = lm
        self.slots = slots
        self.width = 0
        self.lengths = [0] * slots  # canvas length of each slot's request; 0 = free
        self.canvas = torch.empty((slots, 0), dtype=torch.long, device=lm.device)
        self.attention = torch.empty((slots, 0), dtype=torch.bool, device=lm.device)
        self.cache: KVCache | None = None
        self._hidden_levels: set[int] = set()
        self._queries = False  # the cache keeps every layer's queries (Elastic-Cache)
        # A block-causal model with a token shift (Fast-dLLM v2) computes the column left of a block that may
        # start at the first prompt token: one spare column of padding keeps it inside the frame.
        self.spare = lm.model.extra_left if lm.config.block_causal else 0

    # ---- slots ------------------------------------------------------------

    def free_slots(self) -> list[int]:
        return [s for s, n in enumerate(self.lengths) if n == 0]

    def place(
        self,
        slot: int,
        prompt: list[int],
        gen_length: int,
        *,
        cached: bool,
        skip_schedule=None,
        every_layer: bool = False,
    ) -> None:
        """Write a new request's canvas into a free slot (widening the frame if needed)."""
        length = len(prompt) + gen_length
        self.lengths[slot] = length
        if cached:
            self._ensure_cache(skip_schedule, every_layer)
        if length + self.spare > self.width:
            self._resize(length + self.spare)
        c = self.lm.config
        row = torch.full((self.width,), c.pad_id, dtype=torch.long)
        row[self.width - length : self.width - gen_length] = torch.tensor(prompt, dtype=torch.long)
        row[self.width - gen_length :] = c.mask_id
        self.canvas[slot] = row.to(self.lm.device)
        self.attention[slot] = False
        self.attention[slot, self.width - length :] = True

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._make_dummy(slot)
        needed = max(self.lengths) + self.spare
        if needed < self.width:
            self._resize(needed)

    def first_real(self, slot: int) -> int:
        """The slot's first real column (a free slot's dummy token is its last column)."""
        return self.width - (self.lengths[slot] or 1)

    def row_selector(self, slots: list[int], slot_ids: torch.Tensor):
        """How a forward over `slots` (ascending) picks its rows: None for every slot, a slice
        for a contiguous run (the cache is then read as a view), else the slot ids."""
        if slots == list(range(self.slots)):
            return None
        if slots == list(range(slots[0], slots[-1] + 1)):
            return slice(slots[0], slots[-1] + 1)
        return slot_ids

    def block_start(self, slot: int, gen_length: int, block_start_in_answer: int) -> int:
        """Absolute column of the first position of a block of the slot's answer."""
        return self.width - gen_length + block_start_in_answer

    # ---- storage ----------------------------------------------------------

    def _ensure_cache(self, skip_schedule, every_layer: bool = False) -> None:
        n_layers = self.lm.config.n_layers
        levels = set(hidden_levels(skip_schedule, n_layers)) if skip_schedule else set()
        levels |= set(range(n_layers)) if every_layer else set()
        if self.cache is not None and levels <= self._hidden_levels and (self._queries or not every_layer):
            return
        self._hidden_levels |= levels
        self._queries = self._queries or every_layer
        old = self.cache
        self.cache = KVCache.allocate(
            self.lm.config.n_layers,
            self.slots,
            self.lm.config.n_kv_heads,
            max(self.width, 1),
            self.lm.config.head_dim,
            self.lm.device,
            self.lm.dtype,
            hidden_levels=sorted(self._hidden_levels),
            hidden_size=self.lm.config.hidden_size,
            n_heads=self.lm.config.n_heads if self._queries else None,
        )
        if old is not None:  # keep what the in-flight rows have (new hidden levels start empty)
            for new_t, old_t in zip(self.cache.keys + self.cache.values, old.keys + old.values):
                new_t.copy_(old_t)
            for level, h in old.hidden.items():
                self.cache.hidden[level].copy_(h)
            for new_q, old_q in zip(self.cache.queries or (), old.queries or ()):
                new_q.copy_(old_q)
            for name in ("attention_mask", "positions", "filled"):
                getattr(self.cache, name).copy_(getattr(old, name))

    def _resize(self, width: int) -> None:
        """Move every row to a frame `width` columns wide, keeping it right-aligned."""
        width = max(width, 1)
        keep = min(width, self.width)
        c = self.lm.config

        def moved(t: torch.Tensor, dim: int, fill) -> torch.Tensor:
            shape = list(t.shape)
            shape[dim] = width
            out = torch.full(shape, fill, dtype=t.dtype, device=t.device)
            if keep:
                out.narrow(dim, width - keep, keep).copy_(t.narrow(dim, t.shape[dim] - keep, keep))
            return out

        self.canvas = moved(self.canvas, 1, c.pad_id)
        self.attention = moved(self.attention, 1, False)
        if self.cache is not None:
            k = self.cache
            k.keys = [moved(t, 2, 0) for t in k.keys]
            k.values = [moved(t, 2, 0) for t in k.values]
            k.hidden = {level: moved(h, 1, 0) for level, h in k.hidden.items()}
            if k.queries is not None:  # Elastic-Cache's queries move with the cache
                k.queries = [moved(t, 2, 0) for t in k.queries]
            if k.work_keys is not None:  # prefix mode's working copy moves with the cache
                k.work_keys = [moved(t, 2, 0) for t in k.work_keys]
                k.work_values = [moved(t, 2, 0) for t in k.work_values]
            k.attention_mask = moved(k.attention_mask, 1, False)
            k.positions = moved(k.positions, 1, 0)
        self.width = width
        for slot, n in enumerate(self.lengths):
            if n == 0:
                self._make_dummy(slot)

    def _make_dummy(self, slot: int) -> None:
        if self.width == 0:
            return
        self.canvas[slot] = self.lm.config.pad_id
        self.attention[slot] = False
        self.attention[slot, -1] = True
