"""Mode "prefix" (Fast-dLLM's PrefixCache): the block and everything after it computed; the K/V of
the positions left of each row's block read from the cache (Dream also computes start - 1)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import CachedCanvasMode, Call


@dataclass(kw_only=True)
class Prefix(CachedCanvasMode):
    name = "prefix"

    def computed_positions(self, call: Call, starts, extra: int) -> dict:
        """[lo, L) from the leftmost row's block start; a row whose block starts right of lo keeps its cached
        K/V up to its own start (``fresh_from``: as it would alone). The cache keeps no hidden states here."""
        lo = min(call.starts) - extra  # the host list: no device sync
        fresh_from = starts - extra if max(call.starts) - extra != lo else None
        return dict(lo=lo, fresh_from=fresh_from, reads_cache=True, keeps_hidden=False)
