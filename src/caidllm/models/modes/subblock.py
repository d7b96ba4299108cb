"""Mode "subblock": Fast-dLLM v2's within-block cache (the official generator's ``use_block_cache``
path), block-causal models only. Once a sub-block's first position is decoded, a step computes that
sub-block only: its fresh keys/values are written into the cache; the other positions of the current
block are read from it as the block's last whole forward (or a later sub-block forward) wrote them,
earlier blocks as the exact block cache holds them; later blocks are never seen.

columns: [R, n] absolute canvas columns of each row's sub-block (ascending); block_at: [R, block]
index of each block position among them (0 where it is not one: no policy commits it), so the
logits come back [R, block, V].
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from ..transfer import to_device
from .base import ColumnsMode


@dataclass(kw_only=True)
class SubBlock(ColumnsMode):
    name = "subblock"
    shift_within_computed = (
        True  # as the official generator shifts the sub-block's logits (models/fastdllm_v2.py)
    )

    def check_model(self, lm) -> None:
        if not lm.config.block_causal:
            raise InputError(
                f"the subblock forward needs a block-causal model; the {lm.config.family} model's "
                "attention is bidirectional"
            )

    @staticmethod
    def group_key(request) -> tuple:
        return (request.config.policy_settings.sub_block,)

    @classmethod
    def for_rows(cls, requests, masked, starts, **common):
        """Each row's current sub-block (its cache mode's current_sub_block, decode/caches/exact.py) as
        absolute columns."""
        columns, block_at = [], []
        for r, start in zip(requests, starts):
            first, size = r.cache_mode.current_sub_block(r), r.config.policy_settings.sub_block
            columns.append([start + first + j for j in range(size)])
            block_at.append(
                [b - first if first <= b < first + size else 0 for b in range(r.config.block_length)]
            )
        device = masked.device
        return cls(columns=to_device(columns, device), block_at=to_device(block_at, device), **common)

    def computed_pairs(self, n_layers: int, block_length: int) -> int:
        return n_layers * self.columns.shape[1]
