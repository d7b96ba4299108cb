"""Mode "dual" (Fast-dLLM's DualCache): the block only computed, its fresh K/V written into the
cache; every other position's K/V read from it (Dream also computes start - 1)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import CachedCanvasMode


@dataclass(kw_only=True)
class Dual(CachedCanvasMode):
    name = "dual"
