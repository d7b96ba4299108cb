"""Mode "es": the dual cache with ES-dLLM's early skipping (models/skip.py). Past each group
boundary of ``skip.schedule`` only the most important block positions go on; a skipped position's
K/V at later layers and its final hidden state come from the cache, which must be made with
new_cache(..., skip_schedule=...). ``skip`` carries the previous step's view and receives the
work done (its kept positions and computed pairs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import InputError
from ..skip import EarlySkip, hidden_levels, keep_counts
from ..transfer import to_device
from .base import Call, CachedCanvasMode, cached_forward


@dataclass(kw_only=True)
class EarlySkipping(CachedCanvasMode):
    name = "es"
    skip: EarlySkip | None = None

    def check_inputs(self, lm, call: Call) -> None:
        skip = self.skip
        if not isinstance(skip, EarlySkip):
            raise InputError(f"mode 'es' needs skip=EarlySkip(...), got {type(skip).__name__}")
        skip.check(len(call.starts), call.length)
        needed = hidden_levels(skip.schedule, lm.config.n_layers)
        missing = [level for level in needed if level not in call.cache.hidden]
        if missing:
            raise InputError(f"mode 'es': the cache keeps no hidden states at layers {missing}; "
                             "make it with new_cache(..., skip_schedule=<the same schedule>)")
        skip.prev_confidence = skip.prev_confidence.to(lm.device)
        skip.just_committed = skip.just_committed.to(lm.device)
        skip.masked = skip.masked.to(lm.device)

    def run(self, lm, call: Call):
        skip, n_layers = self.skip, lm.config.n_layers
        plan = keep_counts(skip.schedule, n_layers, call.length)
        extra = self.extra(lm)
        logits, ctx = cached_forward(lm, call, self.name, extra, key_end=self.key_end, skip=skip, plan=plan)
        skip.computed_pairs, skip.full_pairs = sum(plan), n_layers * call.length
        skip.kept = ctx.index[:, extra:] - to_device(call.starts, lm.device)[:, None]
        return logits

    @staticmethod
    def group_key(request) -> tuple:
        settings = request.config.cache_settings
        return (settings.schedule, settings.alpha)

    @classmethod
    def for_rows(cls, requests, masked, starts, **common):
        """Each row's previous confidences and commits (the engine keeps them on the request)."""
        settings = requests[0].config.cache_settings
        skip = EarlySkip(torch.stack([r.prev_confidence for r in requests]),
                         torch.stack([r.just_committed for r in requests]), masked,
                         settings.schedule, settings.alpha)
        return cls(skip=skip, **common)

    def computed_pairs(self, n_layers: int, block_length: int) -> int:
        return self.skip.computed_pairs
