"""S2D2's AR-like caching, SDAR's (phymhan/S2D2 SDAR/generate_ssd_policy.py ``block_diffusion_generate``,
``--cache_ver --draft_ver``, the paper's SDAR configurations).

- ``cache_ver``: the keys and values of every position before the current block (the prompt's complete
  blocks at the prefill, each finished block when it is written to the cache) are computed token-causally,
  as an autoregressive model computes them (the official loop passes its causal verifier mask to those
  forwards), instead of block-causally. The draft forward of the current block stays block-causal, the
  verify forward reads those keys and values as it reads any cache.
- ``draft_ver`` (only with ``cache_ver``): in the draft forward, the block's decoded prefix (its positions
  before the first mask) reads token-causally too, the masks after it as before.

Here both are one [lo, hi) span of RoPE positions per request whose queries attend token-causally
(models/layers.py: Context.causal_span): [0, the block's first position), and with ``draft_ver`` up to the
block's first mask. The exact block cache writes a finished block at the next block's first forward (its
``fold``), whose rows lie in that span; a request's cache row is its own, so its keys and values never
depend on its batch, and the prefix store does not serve it (decode/prefix_reuse.py: its stored blocks are
block-causal ones).

Not offered: ``draft_ver`` without ``cache_ver`` (the official loop then writes each finished block with
the draft's mask as its last draft step left it, the decoded prefix's rows token-causal and the rest
block-causal: not re-stated here); AR-like caching under LLaDA2's loop (it has none) and Fast-dLLM v2's
(its own shifted forward: not re-stated).
"""

from __future__ import annotations

import torch

from caidllm.errors import InputError
from caidllm.setting_rules import named

CACHES = ("block",)  # the exact block cache


def causal_span(masked: torch.Tensor, block_position: torch.Tensor, draft_ver: bool) -> torch.Tensor:
    """[2] long: the RoPE positions [lo, hi) of a request's token-causal queries this step (masked [block]
    the block's masks, block_position the block's first position, on the device: no host sync)."""
    hi = block_position.reshape(())
    if draft_ver:  # the decoded prefix: up to the first mask (argmax of the first True)
        hi = hi + masked.int().argmax()
    return torch.stack([torch.zeros_like(hi), hi])


def check_settings(s, config) -> None:
    """The combinations the official loop runs here; InputError naming the field."""
    if s.draft_ver and not s.cache_ver:
        name, field_ = named(config.labels, "s2d2.draft_ver")
        raise InputError(
            f"{name}=True needs s2d2.cache_ver=True here (the official loop's draft_ver alone writes each "
            "finished block with a mixed mask, not re-stated)",
            field=field_,
        )
    if not s.cache_ver:
        return
    name, field_ = named(config.labels, "s2d2.cache_ver")
    if s.sub_block is not None:
        raise InputError(
            f"{name}=True does not apply with s2d2.sub_block (Fast-dLLM v2's rule: its AR-like caching is "
            "not implemented here)",
            field=field_,
        )
    if config.cache not in CACHES:
        raise InputError(
            f"{name}=True needs cache 'block' (the exact block cache), got {config.cache!r}",
            field=field_,
        )


# The block-causal families whose official S2D2 loop has no AR-like caching here.
OTHER_LOOPS = {
    "llada2": "LLaDA2/generate_utils.py, which has none",
    "fastdllm_v2": "Fast-dLLM v2's loop (its cache_ver / draft_ver not re-stated here)",
}


def check_model(s, config, family: str) -> None:
    """AR-like caching is SDAR's loop's: refused on a family whose S2D2 loop is another."""
    if not s.cache_ver or family not in OTHER_LOOPS:
        return
    name, field_ = named(config.labels, "s2d2.cache_ver")
    advice = "; method s2d2-llada2 is LLaDA2.1's configuration" if family == "llada2" else ""
    raise InputError(
        f"{name}=True is SDAR's AR-like caching (SDAR/generate_ssd_policy.py); model family {family!r} "
        f"decodes with {OTHER_LOOPS[family]} (set {name}=false{advice})",
        field=field_,
    )
