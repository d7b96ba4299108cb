"""The forward modes of a DiffusionLM, one small module each, and their registry.

``DiffusionLM.forward(ids, mask, cache, mode)`` takes one mode object (a typed spec of that mode's
inputs, models/modes/base.py); the engine reads the same registry: a cache setting names the mode
it runs between refreshes (decode/forward_modes.py), and each step builds the mode object of a
forward group with the class's ``for_rows``. Adding a mode: one module here with its class, and
its line in FORWARD_MODES.
"""

from __future__ import annotations

from .base import Call, ForwardMode
from .block import Block
from .dkv import DKV
from .dual import Dual
from .elastic import Elastic
from .es import EarlySkipping
from .full import Full
from .prefix import Prefix
from .subblock import SubBlock
from .verify import Verify

FORWARD_MODES: dict[str, type[ForwardMode]] = {
    mode.name: mode for mode in (Full, Prefix, Dual, EarlySkipping, DKV, Elastic, Verify, Block, SubBlock)
}
MODES = tuple(FORWARD_MODES)

__all__ = [
    "FORWARD_MODES",
    "MODES",
    "Block",
    "Call",
    "DKV",
    "Dual",
    "EarlySkipping",
    "Elastic",
    "ForwardMode",
    "Full",
    "Prefix",
    "SubBlock",
    "Verify",
]
