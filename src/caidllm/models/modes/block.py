"""Mode "block": block-causal models' exact block cache. Computes [start, end) (and the ``fold``
positions left of start: a just-completed block, whose final K/V are written here once) against
the cache, whose K/V of every earlier block are final; later blocks are never read.

Engine: after a completed block the previous one is folded in (CacheMode.fold; the scheduler groups
rows by it, so every member of a group has the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from .base import CachedCanvasMode


@dataclass(kw_only=True)
class Block(CachedCanvasMode):
    name = "block"
    fold: int = 0

    def check_model(self, lm) -> None:
        if not lm.config.block_causal:
            raise InputError(
                f"mode 'block' (the exact block cache) needs a block-causal model; the "
                f"{lm.config.family} model's attention is bidirectional"
            )
        if not isinstance(self.fold, int) or isinstance(self.fold, bool) or self.fold < 0:
            raise InputError(f"fold={self.fold!r}: a non-negative int")

    def extra(self, lm) -> int:
        return lm.model.extra_left + self.fold

    @classmethod
    def for_rows(cls, requests, masked, starts, **common):
        return cls(fold=requests[0].cache_mode.fold(requests[0]), **common)
