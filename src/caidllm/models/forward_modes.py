"""The forwards a DiffusionLM runs (DiffusionLM.forward's `mode`), by name.

The one list of them: the model checks `mode` against it, and the engine's
per-mode plans (decode/forward_modes.py) have one entry per member.
"""

from __future__ import annotations

from enum import Enum


class ForwardMode(str, Enum):
    """A forward mode; a str, so ``mode == "dual"`` and plain strings keep working."""

    FULL = "full"  # every position; fills the cache if one is given (a refresh)
    PREFIX = "prefix"  # the block and everything after it; the prefix's K/V from the cache
    DUAL = "dual"  # the block only; every other position's K/V from the cache
    ES = "es"  # dual with early skipping of unimportant block positions past layer-group boundaries
    DKV = "dkv"  # dKV-Cache: the still-masked and just-decoded columns only; every other column's K/V cached
    # Elastic-Cache: the block's window and the most-attended columns; every column from a layer on (a refresh)
    ELASTIC = "elastic"
    VERIFY = "verify"  # WINO: the whole canvas plus a shadow copy of the block that verifies it (no cache)
    BLOCK = "block"  # block-causal models' exact cache: the block (and a just-completed one, folded) only
    # Fast-dLLM v2's within-block cache: one sub-block of the block only; the rest of the block's K/V from the
    # block's last whole forward (or later sub-block forwards), earlier blocks' from the exact cache
    SUBBLOCK = "subblock"

    def __str__(self) -> str:
        return self.value

    __hash__ = str.__hash__  # a member and its name are the same dict key: PLANS["es"] is PLANS[ForwardMode.ES]


MODES = tuple(mode.value for mode in ForwardMode)
