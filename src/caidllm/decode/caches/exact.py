"""Cache modes "block" and "subblock": block-causal models' exact block cache (models/modes/block.py),
and Fast-dLLM v2's within-block cache over it (models/modes/subblock.py). Never refreshed: one full
forward, the request's first (none when its first blocks came from the prefix store)."""

from __future__ import annotations

from dataclasses import dataclass

from caidllm.decode.caches.base import CacheMode
from caidllm.models.modes import Full, SubBlock


@dataclass(frozen=True)
class ExactCache(CacheMode):
    # Fast-dLLM v2's within-block cache: once the block has had a whole forward with its first position
    # known and the current sub-block's first position is decoded, a step computes that sub-block only.
    within_block: bool = False
    exact: bool = True

    def forward_mode(self, request) -> str:
        if request.block == 0 and request.step == 0 and not request.reused:
            return Full.name
        if self.within_block and sub_block_cached(request):
            return SubBlock.name
        return self.between_refreshes.name

    def current_sub_block(self, request) -> int:
        return current_sub_block(request)

    def fold(self, request) -> int:
        """The previous block, whose final keys/values the exact cache writes at the next block's first
        step; at the first step of a request that took blocks from the prefix store, the prompt positions
        after them."""
        if request.step:
            return 0
        if request.block:
            return request.config.block_length
        return len(request.prompt) - request.layout.lead - request.reused if request.reused else 0


def current_sub_block(request) -> int:
    """Block position where the first sub-block that still holds a mask starts."""
    block_start, block_end = request.block_bounds
    first = next(
        (p - block_start for p in range(max(block_start, 0), block_end) if request.generated[p] is None),
        block_end - block_start - 1,
    )
    return first - first % request.config.policy_settings.sub_block


def sub_block_cached(request) -> bool:
    """Whether the within-block cache serves this step: the block has had a whole forward with its first
    position known (a block whose first position is generated spends its first step on that position
    alone), and the current sub-block's first position is decoded."""
    block_start = request.block_bounds[0]
    if request.step <= int(block_start >= 0):
        return False
    first = block_start + current_sub_block(request)
    return first < 0 or request.generated[first] is not None
