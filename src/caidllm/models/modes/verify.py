"""Mode "verify": WINO's verify forward (models/shadow.py): logits [R, 2 (end - start), V], the block's
then its shadow block's; no cache. Each row runs alone over its own unpadded canvas (rows must be
left-padded), so a row's numbers never depend on its neighbours."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from ..shadow import shadow_forward
from .base import Call, ForwardMode


@dataclass(kw_only=True)
class Verify(ForwardMode):
    name = "verify"
    uses_cache = False
    shadow = True
    unshifted = True
    bidirectional = True

    def check_inputs(self, lm, call: Call) -> None:
        if (
            self.key_end is not None
        ):  # its shadow block reads the whole canvas (no policy with a horizon uses it)
            raise InputError("mode 'verify' takes no key_end: its shadow block reads the whole canvas")
        if call.real_from is None:
            raise InputError("mode 'verify' needs left-padded rows (real tokens contiguous up to the end)")

    def extra(self, lm) -> int:
        return 0

    def run(self, lm, call: Call):
        self.check_model(lm)  # the engine refuses these models before; a vouched call is checked here too
        rows = call.ids[call.r]
        canvases = [row[first:] for row, first in zip(rows, call.real_from)]
        return shadow_forward(lm, canvases, [s - f for s, f in zip(call.starts, call.real_from)], call.length)
