"""Cache mode "es": the dual cache with ES-dLLM's early skipping (models/modes/es.py runs the forward).
Its next forward reads this step's confidences and commits (the importance of each block position),
kept per request in EarlySkippingState; the cache row keeps hidden states at the schedule's layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from caidllm.decode.caches.base import CacheMode


@dataclass
class EarlySkippingState:
    prev_confidence: torch.Tensor | None = None  # [block] the previous step's confidences
    just_committed: torch.Tensor | None = None  # [block] committed at the previous step


@dataclass(frozen=True)
class EarlySkippingCache(CacheMode):
    def new_state(self, request, lm) -> EarlySkippingState:
        return EarlySkippingState()

    def frame_options(self, config) -> dict:
        return dict(skip_schedule=config.cache_settings.schedule)

    def after_step(self, request, confidence: torch.Tensor, committed: torch.Tensor) -> None:
        state = request.cache_state
        state.prev_confidence, state.just_committed = confidence, committed
