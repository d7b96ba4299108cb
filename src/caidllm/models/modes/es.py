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
from ..layers import Context
from ..skip import EarlySkip, choose, forced_keeps, hidden_levels, importance, keep_counts, relative_drift
from ..transfer import to_device
from .base import CachedCanvasMode, Call, cached_forward


@dataclass
class EarlySkipContext(Context):
    """The dual cache's Context, but at the layers where ``plan`` drops, only the most important block
    positions go on (``index`` then narrows); a skipped position's final hidden state comes from the cache."""

    skip: EarlySkip | None = None
    plan: list[int] | None = None  # block positions that run each layer
    forced: torch.Tensor | None = None  # [R, block] forced keeps

    def __post_init__(self):
        super().__post_init__()
        self.forced = forced_keeps(self.skip.prev_confidence, self.skip.masked, self.skip.just_committed)

    def enter(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        if self.plan[layer] < x.shape[1] - self.extra:
            x = self._drop(layer, x)
        return super().enter(layer, x)

    def leave(self, level: int, x: torch.Tensor) -> torch.Tensor:
        super().leave(level, x)
        # just written where computed, cached elsewhere
        return self.cache.hidden[level][self.row_ids, self.computed]

    def _drop(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Keep the plan[layer] most important block positions of each row (and the always-computed ones
        left of the block); narrow x, RoPE and the index to them."""
        extra = self.extra
        running = self.index[:, extra:]  # [R, k] absolute positions of the running block positions
        cached = self.cache.hidden[layer][self.row_ids, running]
        drift = relative_drift(x[:, extra:], cached)
        local = running - self.targets[:, :1]
        scores = importance(
            self.skip.prev_confidence.gather(1, local), drift, self.forced.gather(1, local), self.skip.alpha
        )
        chosen = choose(scores, self.plan[layer]) + extra
        keep = torch.cat([torch.arange(extra, device=x.device).expand(len(x), -1), chosen], dim=1)
        self.index = self.index.gather(1, keep)
        self.cos = self.cos.gather(2, keep[:, None, :, None].expand(-1, 1, -1, self.cos.shape[-1]))
        self.sin = self.sin.gather(2, keep[:, None, :, None].expand(-1, 1, -1, self.sin.shape[-1]))
        return x.gather(1, keep[..., None].expand(-1, -1, x.shape[-1]))


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
            raise InputError(
                f"mode 'es': the cache keeps no hidden states at layers {missing}; "
                "make it with new_cache(..., skip_schedule=<the same schedule>)"
            )
        skip.prev_confidence = skip.prev_confidence.to(lm.device)
        skip.just_committed = skip.just_committed.to(lm.device)
        skip.masked = skip.masked.to(lm.device)

    def run(self, lm, call: Call):
        skip, n_layers = self.skip, lm.config.n_layers
        plan = keep_counts(skip.schedule, n_layers, call.length)
        extra = self.extra(lm)
        logits, ctx = cached_forward(lm, call, self, extra, context=EarlySkipContext, skip=skip, plan=plan)
        skip.computed_pairs, skip.full_pairs = sum(plan), n_layers * call.length
        skip.kept = ctx.index[:, extra:] - to_device(call.starts, lm.device)[:, None]
        return logits

    @staticmethod
    def group_key(request) -> tuple:
        settings = request.config.cache_settings
        return (settings.schedule, settings.alpha)

    @classmethod
    def for_rows(cls, requests, masked, starts, **common):
        """Each row's previous confidences and commits (its cache state keeps them, decode/caches/es.py)."""
        settings = requests[0].config.cache_settings
        skip = EarlySkip(
            torch.stack([r.cache_state.prev_confidence for r in requests]),
            torch.stack([r.cache_state.just_committed for r in requests]),
            masked,
            settings.schedule,
            settings.alpha,
        )
        return cls(skip=skip, **common)

    def computed_pairs(self, n_layers: int, block_length: int) -> int:
        return self.skip.computed_pairs
