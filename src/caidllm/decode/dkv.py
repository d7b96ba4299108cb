"""dKV-Cache-Decode (Ma et al., "dKV-Cache: The Cache for Diffusion Language Models",
arXiv 2505.15781; official code horseee/dKV-Cache, LLaDA's generate with its
`cache_reloading_step`): a decoded token's keys and values are cached one step after it
is decoded (delayed caching: at its decoding step its input was still the mask), and
reused until the next refresh; still-masked positions are computed at every step.

Cache mode "dkv" (Request.forward_mode): a full forward (a refresh: every position's K/V
written into the cache) at a block's first two steps and every `refresh_every` steps
(the paper's headline setting: 8); at the other steps, a forward over the generated
positions that are still masked or were committed at the previous step only, each row's
other columns (the prompt and positions decoded two or more steps ago) read from the cache.
The commit rule is the request's policy (the paper: LLaDA's low-confidence remasking).

Readings taken: the Greedy variant (which also caches masked positions, with a local
window recomputed) is not implemented; LLaDA only (Dream's logit shift needs the position
left of each computed one: refused with a clear error).
"""

from __future__ import annotations

import torch

from caidllm.models.transfer import to_device


def dkv_forward(lm, frame, members, slots: list[int], slot_ids: torch.Tensor) -> torch.Tensor:
    """Logits [R, block, V] of each member's current block from a dkv forward (members compute
    as many columns each). A block position not computed (decoded two or more steps ago) gets
    the logits of the row's first computed column: it is not masked, so no policy reads it."""
    device = lm.device
    columns, block_at = [], []
    for r in members:
        positions = r.dkv_columns()
        offset = frame.width - r.config.gen_length
        columns.append([offset + p for p in positions])
        where = {p: i for i, p in enumerate(positions)}
        gs, ge = r.block_bounds
        block_at.append([where.get(p, 0) for p in range(gs, ge)])
    logits = lm.forward_columns(frame.canvas, frame.cache, to_device(columns, device),
                                rows=frame.row_selector(slots, slot_ids),
                                real_from=[frame.first_real(s) for s in slots])
    at = to_device(block_at, device)
    return logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))
