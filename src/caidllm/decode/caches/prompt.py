"""Cache mode "prompt": dLLM-Cache's long-interval prompt cache (Liu et al., "dLLM-Cache: Accelerating
Diffusion Large Language Models with Adaptive Caching", arXiv 2506.06295) with its response refreshed at
every step. The prompt's keys and values change little from step to step, so between refreshes a forward
computes only the generated region (every answer position, masked or not) and reads the prompt's K/V from
the cache, which the last full forward filled; a refresh is a full forward, at a block's first step and
every `refresh_every` steps within it (the engine's schedule, as for the other approximate caches;
dLLM-Cache counts its prompt interval over the whole generation and caches the response too).

It runs the column forward (models/modes/dkv.py) over the columns named here, so a family that predicts
position i from i - 1 (Dream) is refused with the reason, as dKV-Cache is.
"""

from __future__ import annotations

from dataclasses import dataclass

from caidllm.decode.caches.base import CacheMode


@dataclass(frozen=True)
class PromptCache(CacheMode):
    def columns(self, request) -> list[int]:
        """The computed positions of the generated region: all of them."""
        return list(range(len(request.generated)))
