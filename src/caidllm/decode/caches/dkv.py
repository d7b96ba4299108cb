"""Cache modes "dkv" and "dkv-greedy": dKV-Cache (Ma et al., arXiv 2505.15781; official code
horseee/dKV-Cache). models/modes/dkv.py runs the forward over the columns chosen here.

Decode: a decoded token's K/V are cached one step after it is decoded (at its decoding step its input
was still the mask), so a forward computes the generated positions still masked or committed at the
previous step; refreshes at a block's first two steps and every f. Greedy: only the positions the step
decodes (an ordered policy's schedule, policies/random_order.py), the previous step's and up to
`dkv_window` still-masked neighbours of each; its official generate refreshes at steps 0, f, 2f ...
"""

from __future__ import annotations

from dataclasses import dataclass

from caidllm.decode.caches.base import CacheMode


@dataclass(frozen=True)
class DKVCache(CacheMode):
    greedy: bool = False

    def columns(self, request) -> list[int]:
        """The computed positions of the generated region (nearest masked neighbours: left, then right)."""
        recent = set(request.last_committed)
        generated = request.generated
        if not self.greedy:
            return [p for p, token in enumerate(generated) if token is None or p in recent]
        order = request.policy_state  # the ordered policy's schedule (a greedy request's policy is one)
        now, before = order.scheduled(request, request.step), order.scheduled(request, request.step - 1)
        chosen = set(now) | set(before)
        masked = {p for p, token in enumerate(generated) if token is None} | recent
        for p in now:
            chosen |= set(
                nearest_masked(p, masked - chosen, request.config.cache_settings.window, len(generated))
            )
        return sorted(chosen)


def nearest_masked(position: int, masked: set[int], size: int, length: int) -> list[int]:
    """Up to `size` of the `masked` positions nearest `position`, looking left and right in turn."""
    found, left, right, look_left = [], position - 1, position + 1, True
    while len(found) < size and (left >= 0 or right < length):
        if look_left:
            if left in masked:
                found.append(left)
            left -= 1
        else:
            if right < length and right in masked:
                found.append(right)
            right += 1
        look_left = not look_left
    return found
