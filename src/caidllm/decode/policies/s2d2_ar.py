"""S2D2's AR-like caching, SDAR's (phymhan/S2D2 SDAR/generate_ssd_policy.py ``block_diffusion_generate``,
``--cache_ver --draft_ver``, the paper's SDAR configurations).

- ``cache_ver``: the keys and values of every position before the current block (the prompt's complete
  blocks at the prefill, each finished block when it is written to the cache) are computed token-causally,
  as an autoregressive model computes them (the official loop passes its causal verifier mask to those
  forwards), instead of block-causally. The draft forward of the current block stays block-causal, the
  verify forward reads those keys and values as it reads any cache.
- ``draft_ver``: in the draft forward, the block's decoded prefix (its positions before the first mask)
  reads token-causally too, the masks after it as before. The official loop writes those rows into its
  block-causal mask in place, so without ``cache_ver`` a finished block is written to the cache with the
  mask its last draft step left: the rows before that step's first mask token-causal, the rest
  block-causal.

Here each step is one [lo, hi) span of RoPE positions per request whose queries attend token-causally
(models/layers.py: Context.causal_span). With ``cache_ver``: [0, the block's first position), and with
``draft_ver`` up to the block's first mask. With ``draft_ver`` alone: the block's decoded prefix, and at a
block's first step (whose forward writes the previous block, the exact cache's ``fold``) the previous
block's prefix as its last draft step had it. A request's cache row is its own, so its keys and values
never depend on its batch, and the prefix store does not serve it (decode/prefix_reuse.py: its stored
blocks are block-causal ones).

Not offered: AR-like caching under LLaDA2's loop (it has none) and Fast-dLLM v2's (its own shifted
forward: not re-stated).
"""

from __future__ import annotations

import torch

from caidllm.errors import InputError
from caidllm.setting_rules import named

CACHES = ("block",)  # the exact block cache


def causal_span(
    request, masked: torch.Tensor, block_position: torch.Tensor, cache_ver: bool, draft_ver: bool
) -> torch.Tensor:
    """[2] long: the RoPE positions [lo, hi) of the request's token-causal queries this step (masked [block]
    the block's masks, block_position the block's first position, on the device: no host sync)."""
    start = block_position.reshape(())
    prefix = masked.int().argmax() if draft_ver else torch.zeros_like(start)  # the first mask
    if cache_ver:
        return torch.stack([torch.zeros_like(start), start + prefix])
    state = request.policy_state
    folds = request.block > 0 and request.cache_mode.fold(request) == masked.shape[0]
    if folds:  # the previous block's write: its rows as its last draft step's mask had them (a fresh block
        # has no decoded prefix of its own)
        span = torch.stack([start - masked.shape[0], start - masked.shape[0] + state.draft_prefix])
    else:
        span = torch.stack([start, start + prefix])
    state.draft_prefix = prefix
    return span


def check_settings(s, config) -> None:
    """The combinations the official loop runs here; InputError naming the field."""
    if not (s.cache_ver or s.draft_ver):
        return
    name, field_ = named(config.labels, "s2d2.cache_ver" if s.cache_ver else "s2d2.draft_ver")
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
    if not (s.cache_ver or s.draft_ver) or family not in OTHER_LOOPS:
        return
    name, field_ = named(config.labels, "s2d2.cache_ver" if s.cache_ver else "s2d2.draft_ver")
    on = [f"s2d2.{key}" for key in ("cache_ver", "draft_ver") if getattr(s, key)]
    advice = "; method s2d2-llada2 is LLaDA2.1's configuration" if family == "llada2" else ""
    raise InputError(
        f"{name}=True is SDAR's AR-like caching (SDAR/generate_ssd_policy.py); model family {family!r} "
        f"decodes with {OTHER_LOOPS[family]} (set {' and '.join(f'{o}=false' for o in on)}{advice})",
        field=field_,
    )
