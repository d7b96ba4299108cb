"""What every cache mode (a value of DecodeConfig.cache) shares: the forward it runs between
refreshes and the hooks the engine calls. A cache mode that needs memory across steps keeps it in
its own state object, made for each request by ``new_state`` and held at ``request.cache_state``;
``Request`` holds only what every request has. Requests are read through the attributes every
request has (decode/request.py): block, step, generated, prompt, config, last_committed, ...
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from caidllm.models.modes import ForwardMode, Full
from caidllm.setting_rules import CacheSettings, NoCacheSettings


@dataclass(frozen=True)
class CacheMode:
    """A cache setting: the forward a request runs between refreshes (a refresh is always a full
    forward, at a block's first `refreshes_at_start` steps and every `refresh_every` steps after)."""

    between_refreshes: type[ForwardMode]
    refreshes_at_start: int = 1
    # Exact (block-causal models): never refreshed; a full forward only as the request's first.
    exact: bool = False
    # What the method is, for a refusal on a model it cannot run on (None: a plain cache, no method of its
    # own).
    method: str | None = None
    settings_type: type[CacheSettings] = NoCacheSettings  # its settings dataclass, declared next to its code

    @property
    def uses_cache(self) -> bool:
        return self.between_refreshes is not Full

    @property
    def refreshes(self) -> bool:
        """Whether it refreshes on a period (refresh_every): a cache that is not exact."""
        return self.uses_cache and not self.exact

    def refusal(self, config, lm) -> str | None:
        """Why this mode cannot run `config` on the model `lm` (None: it can); the engine refuses the
        request."""
        return None

    def check_settings(self, config, lm) -> None:
        """Refuse settings of this mode that the model `lm` cannot take (InputError naming the field)."""

    def new_state(self, request, lm) -> object | None:
        """The request's own memory across steps (request.cache_state); None: it needs none."""
        return None

    def refresh_every(self, configured: int) -> int:
        """Steps between refreshes for this mode (configured: the request's or the model's; 0: never)."""
        return configured

    def frame_options(self, config) -> dict:
        """What the request's cache row keeps beyond keys and values (Frame.place's keywords)."""
        return {}

    def forward_mode(self, request) -> str:
        """This step's forward (a name in models/modes): a full one at the block start and every f steps,
        this mode's forward otherwise."""
        t, every = request.step, request.refresh_every
        refresh = t < self.refreshes_at_start or (every > 0 and t % every == 0)
        return (Full if refresh else self.between_refreshes).name

    def fold(self, request) -> int:
        """Positions left of the block that this step's forward recomputes (models/modes/block.py)."""
        return 0

    def commit_only(self, request) -> set[int] | None:
        """The block positions this step may commit (None: any masked one)."""
        return None

    def after_step(self, request, confidence: torch.Tensor, committed: torch.Tensor) -> None:
        """The step's [block] confidences and commits, on the device, for a mode whose next forward reads
        them."""

    def after_record(self, request, positions: list[int], eos_ids: set[int], eos_id: int) -> None:
        """The step's commits were recorded (request.record): generated positions `positions`."""
