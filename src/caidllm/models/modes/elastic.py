"""Mode "elastic": Elastic-Cache's forward (models/elastic.py computes it; decode/elastic.py is the
loop). ``inputs`` (models/elastic.ElasticInputs) names the columns computed, the window whose logits
come back, the tracked tokens of the drift test and the refresh layer; ``block_at`` in it maps the
window back to the block. A request's first forward (``inputs.whole``) computes every column and
writes the rows' mask into the cache first.

Engine: each request runs alone (one row's drift test must not refresh another's cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from ..elastic import ElasticInputs, forward_elastic
from ..transfer import to_device
from .base import Call, ForwardMode, gather_block


@dataclass(kw_only=True)
class Elastic(ForwardMode):
    name = "elastic"
    bidirectional = True
    inputs: ElasticInputs | None = None

    @property
    def uses_cache(self) -> bool:  # a request's first elastic forward fills the cache itself
        return not (isinstance(self.inputs, ElasticInputs) and self.inputs.whole)

    def check_inputs(self, lm, call: Call) -> None:
        if not isinstance(self.inputs, ElasticInputs):
            raise InputError(
                f"mode 'elastic' needs inputs=ElasticInputs(...), got {type(self.inputs).__name__}"
            )
        if call.cache is None or not call.cache.queries:
            raise InputError(
                "mode 'elastic' needs a cache with every layer's queries: new_cache(..., every_layer=True)"
            )

    def extra(self, lm) -> int:
        return 0

    def run(self, lm, call: Call):
        self.check_model(lm)  # the engine refuses these models before; a vouched call is checked here too
        inputs = self.inputs
        logits = forward_elastic(
            lm,
            call.ids,
            call.cache,
            inputs,
            rows=call.rows,
            real_from=call.real_from,
            mask=call.mask if inputs.whole else None,
            key_end=self.key_end,
        )
        return gather_block(logits, inputs.block_at)

    @staticmethod
    def group_key(request) -> tuple:
        return (request.id,)  # each request alone: one row's drift test must not refresh another's cache

    @classmethod
    def for_rows(cls, requests, masked, starts, **common):
        """Each row's columns, the columns whose logits it returns, its window, its tracked and
        untrackable columns (absolute), and the block positions its logits stand for."""
        columns, targets, windows, tracked, untrackable, block_at, firsts = [], [], [], [], [], [], []
        for r, start in zip(requests, starts):
            computed, returned, window = r.cache_mode.columns(r)  # decode/elastic.py
            first = start - len(r.prompt) - r.block_bounds[0]  # the row's first real column
            firsts.append(first)
            columns.append([first + c for c in computed])
            targets.append([first + c for c in returned])
            windows.append([first + c for c in window])
            tracked.append([first + c for c in r.cache_state.tracked])
            untrackable.append([first + c for c in r.cache_mode.untrackable(r)])
            where = {c - len(r.prompt) - r.block_bounds[0]: i for i, c in enumerate(returned)}
            block_at.append([where.get(b, 0) for b in range(r.config.block_length)])
        device, settings = masked.device, requests[0].config.cache_settings
        inputs = ElasticInputs(
            to_device(columns, device),
            to_device(targets, device),
            requests[0].cache_state.n_layers,
            to_device(block_at, device),
            profiled=to_device(windows, device),
            tracked=tracked,
            untrackable=untrackable,
            gamma=settings.gamma,
            track=settings.track,
            test_from=settings.layer,
            firsts=firsts,
            whole=all(r.step == 0 for r in requests),
        )
        return cls(inputs=inputs, **common)

    def after(self, requests) -> None:
        done = self.inputs
        for r, start, tracked in zip(requests, done.firsts, done.tracked):
            r.cache_state.observe([c - start for c in tracked], done.refresh_from)

    def computed_pairs(self, n_layers: int, block_length: int) -> int:
        """The window below the refresh layer, the whole block from it on."""
        deep = n_layers - self.inputs.refresh_from
        return (n_layers - deep) * self.inputs.window.shape[1] + deep * block_length
