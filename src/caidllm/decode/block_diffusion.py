"""Block diffusion in the engine: which settings apply to which model, and a request's layout.

A block-causal model (LLaDA2.x, SDAR, tiny-bd) sees, from each position, its own block and every
earlier one. Its canvas is laid in blocks from position 0 (the first prompt token), as the
official generators lay it: the block holding the end of the prompt is part prompt, part masks,
and the last block may run past gen_length (those positions are decoded, never returned).
Its exact cache ("block"): the first forward of a request computes the whole canvas (prompt
blocks prefilled once); each later step forwards only the current block against the cache; a
completed block's final keys/values are written by the next block's first forward (``fold``).
"""

from __future__ import annotations

import dataclasses

from caidllm.decode.config import DecodeConfig
from caidllm.decode.presets import BLOCK_DIFFUSION_PRESETS
from caidllm.errors import InputError

BLOCK_CACHES = ("block", "none")  # the exact block cache, or the whole window recomputed every step
BLOCK_POLICIES = ("dynamic", "static")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a request's blocks lie in its generated region (positions after the prompt)."""

    lead: int  # prompt positions in the first decoded block (its block starts `lead` before the answer)
    span: int  # generated positions laid out: gen_length, up to the end of the last block
    num_blocks: int  # blocks decoded

    @classmethod
    def of(cls, prompt_length: int, config: DecodeConfig, block_causal: bool) -> "Layout":
        bl, G = config.block_length, config.gen_length
        if not block_causal:
            return cls(0, G, config.num_blocks)
        lead = prompt_length % bl
        span = -(-(prompt_length + G) // bl) * bl - prompt_length
        return cls(lead, span, (lead + span) // bl)


def fit_to_model(config: DecodeConfig, model) -> DecodeConfig:
    """`config` as it runs on the model (its ModelConfig): a setting the caller gave that does not
    apply to the family raises InputError naming it; a preset's default that does not apply is
    replaced by the family's (a block-causal model's cache is its exact block cache)."""
    given = set(config.given)
    if not model.block_causal:
        if config.method in BLOCK_DIFFUSION_PRESETS or config.policy in BLOCK_POLICIES:
            raise InputError(f"method {config.method!r} (policy {config.policy!r}) is a block-diffusion decoder; "
                             f"the {model.family} model is full-sequence (bidirectional attention)")
        if config.cache == "block":
            raise InputError(f"cache='block' (the exact block cache) does not apply to the {model.family} model: "
                             "its attention is bidirectional; use none, prefix, dual or es")
        return config
    changes = {}
    if config.cache not in BLOCK_CACHES:
        if "cache" in given:
            raise InputError(f"cache={config.cache!r} does not apply to the block-causal {model.family} model: "
                             "its cache is 'block' (exact) or 'none' (the whole window every step)")
        changes["cache"] = "block"
    if model.block_lengths and config.block_length not in model.block_lengths:
        raise InputError(f"block_length {config.block_length} is not one the {model.family} model decodes with "
                         f"(allowed: {', '.join(map(str, model.block_lengths))})")
    if "refresh_every" in given:
        raise InputError("refresh_every does not apply to a block-causal model: its block cache is exact, "
                         "never refreshed")
    return dataclasses.replace(config, **changes) if changes else config
