"""Mode "full": every position computed (K/V fresh); a given cache is filled (a refresh).

Block-causal, without a cache: the window is the blocks up to the rows' current ones (as the
official loops recompute it); later positions are never seen by them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layers import positions_from_mask
from .base import Call, ForwardMode, canvas_forward


@dataclass(kw_only=True)
class Full(ForwardMode):
    """Logits of [start, end) (the whole canvas by default) from a forward over every position."""

    name = "full"
    uses_cache = False

    def extra(self, lm) -> int:
        return 0

    def run(self, lm, call: Call):
        ids, mask, cache = call.ids, call.mask, call.cache
        if cache is None and call.attention_block and call.starts:
            width = max(call.starts) + call.length
            call.ids, mask = ids[:, :width], mask[:, :width]
        mask_r = mask[call.r]
        positions_r = positions_from_mask(mask_r)
        if cache is not None:
            cache.attention_mask[call.r] = mask_r
            cache.positions[call.r] = positions_r
            cache.filled[call.r] = True
        return canvas_forward(lm, call, self, 0, mask_r, positions_r)[0]

    def computed_positions(self, call: Call, starts, extra: int) -> dict:
        # Every position, every K/V fresh (written to a given cache). Without a cache to fill, the columns
        # left of every row's first real one (and of its first target) are padding no one reads: they are
        # not computed (a short row in a frame widened by a long one paid the long one's width at each
        # forward: issue 49).
        lo = 0
        if call.cache is None and call.real_from is not None and call.starts:
            lo = min(*call.real_from, *call.starts)
        return dict(lo=lo, reads_cache=False)
