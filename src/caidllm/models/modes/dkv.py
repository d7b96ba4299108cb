"""Mode "dkv": dKV-Cache (Ma et al., arXiv 2505.15781; official code horseee/dKV-Cache, LLaDA's
generate with `cache_reloading_step`). Computes ``columns`` [R, n] of each row (absolute, ascending);
their K/V are computed and written into the cache (filled by a full forward), every other column's
are read from it. Logits [R, n, V] of the columns, or with ``block_at`` [R, block] (each block
position's index among them) of the block. Families with a logit shift (Dream) cannot run it.

Engine (dKV-Cache-Decode): a decoded token's K/V are cached one step after it is decoded (at its
decoding step its input was still the mask) and reused until the next refresh; still-masked positions
are computed at every step. So the forward computes each row's generated positions that are still
masked or were committed at the previous step (decode/caches/dkv.py; the Greedy variant: a window).
A block position not computed gets the logits of the row's first computed column (it is not masked:
no policy reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...errors import InputError
from ...setting_rules import CacheSettings, Rule, chosen_by, named, non_negative_int
from ..transfer import to_device
from .base import ColumnsMode


@dataclass(kw_only=True)
class DKV(ColumnsMode):
    name = "dkv"
    unshifted = True

    @staticmethod
    def group_key(request) -> tuple:
        return (len(request.cache_mode.columns(request)),)  # rows computing as many columns share a forward

    @classmethod
    def for_rows(cls, requests, masked, starts, **common):
        columns, block_at = [], []
        for r, start in zip(requests, starts):
            positions = r.cache_mode.columns(r)  # decode/caches/dkv.py
            offset = start - r.block_bounds[0]  # the column of generated position 0
            columns.append([offset + p for p in positions])
            where = {p: i for i, p in enumerate(positions)}
            block_start, block_end = r.block_bounds
            block_at.append([where.get(p, 0) for p in range(block_start, block_end)])
        return cls(
            columns=to_device(columns, masked.device), block_at=to_device(block_at, masked.device), **common
        )


@dataclass
class GreedySettings(CacheSettings):
    """dKV-Cache-Greedy (cache "dkv-greedy"): the masked neighbours computed around each position a step
    decodes."""

    window: int = 0

    OWNER: ClassVar[str] = "dkv"
    TITLE: ClassVar[str] = "dKV-Cache-Greedy (arXiv 2505.15781)"
    LEGACY: ClassVar[dict[str, str]] = {"dkv_window": "window"}
    RULES: ClassVar[tuple[Rule, ...]] = (Rule("window", "an integer >= 0", non_negative_int),)

    def check_with(self, config) -> None:
        if config.policy != "random":
            raise InputError(
                f"cache 'dkv-greedy' with policy {config.policy!r} is not meaningful: it computes only "
                "the positions a step will decode, known in advance only from policy 'random' (its "
                "random order), as in the official dKV-Cache-Greedy",
                field=chosen_by(config, "policy"),
            )
        if self.window > config.block_length:
            name, field = named(config.labels, "dkv.window")
            raise InputError(
                f"{name} ({self.window}) is longer than the block ({config.block_length})", field=field
            )
