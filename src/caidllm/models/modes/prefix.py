"""Mode "prefix" (Fast-dLLM's PrefixCache): the block and everything after it computed; the K/V of
the positions left of each row's block read from the cache (Dream also computes start - 1)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import CachedCanvasMode


@dataclass(kw_only=True)
class Prefix(CachedCanvasMode):
    name = "prefix"
