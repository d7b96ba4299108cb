"""A plain re-statement of S2D2 with LLaDA2.1's token editing as phymhan/S2D2 ships it
(LLaDA2/generate_utils.py ``generate_ssd_policy``), for parity tests: batch 1, no cache (the whole window
every step, as s2d2_reference.py), torch's global RNG seeded with the engine's per-request seed.

Per step of a block: the draft (argmax, its float32 softmax probability); the edits (committed positions of
the block that are not the prompt's, whose draft differs from their token with probability above
``editing_threshold``); the first contiguous run of masks; the router (mask_span_length / score_threshold /
score_hysteresis, asked at every step, an editing step with no mask left too); when it verifies and the run
is not empty, the 2L verify forward over the block with the draft filled in and the edits applied, acceptance
``torch.rand(S) < min(1, q / p)`` and the first rejection drawn from (q - p)+; the fallback (every mask
above ``threshold`` when at least the quota pass, else the quota's most confident; the quota
``num_to_transfer``, the edits not counted). A block ends at the first step that starts with no mask and
edits nothing, or when a step would be its (max_post_steps + 1)-th to start with no mask.

Top-k / top-p (``s["top_k"]``, ``s["top_p"]``, temperature 0): LLaDA2's _probs_from_logits filters the
router's estimates, the verify distribution and the draft's distribution in the residual; the draft token
(argmax) and its probability in min(1, q / p) are the unfiltered softmax's.

caidllm's readings kept here (rows of docs/decoder-fidelity.md): the mask token is never predicted; the
prefill's 0/1 mask (the shipped_01_mask of the LLaDA2.1 row) is read block-causally; ``eos_early_stop``
is left out (it stops after a block whose answer has an end token and no mask: the answer, cut at its first
end token, is the same).
"""

from __future__ import annotations

import torch

from bd_reference import _answer, _canvas
from caidllm.decode.sampling import row_seed
from caidllm.models.modes import Full
from s2d2_reference import _draft, _dynamic_fallback, _first_run, _verify_2l, accept, decide


def _probs_from_logits(logits, s):
    """LLaDA2's _probs_from_logits at temperature 0: top_k, then top_p (the model's _top_k_logits and
    _top_p_logits), then softmax; no filter: the plain softmax."""
    top_k, top_p = s.get("top_k", 0), s.get("top_p", 1.0)
    if top_k > 0:
        values, _ = torch.topk(logits, top_k)
        logits = torch.where(logits < values[..., -1, None], torch.full_like(logits, float("-inf")), logits)
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(logits, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        sorted_mask = cumulative > top_p
        sorted_mask[..., 1:] = sorted_mask[..., :-1].clone()
        sorted_mask[..., 0] = False
        mask = torch.scatter(
            torch.full_like(logits, False, dtype=torch.bool), -1, sorted_indices, sorted_mask
        )
        logits = logits.masked_fill(mask, float("-inf"))
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


def s2d2_llada2_generate(
    lm,
    prompt,
    *,
    gen_length,
    block_length,
    threshold,
    editing_threshold,
    max_post_steps,
    s,
    num_to_transfer=1,
    seed=0,
    stop_ids=(),
):
    torch.manual_seed(row_seed(seed, list(prompt)))
    mask_id = lm.config.mask_id
    P, num_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
    state = {"on": False}
    for block in range(P // block_length, num_blocks):
        start, end = block * block_length, (block + 1) * block_length
        prompt_in_block = torch.arange(start, end) < P
        post_steps = 0
        while True:
            old = x[start:end].clone()
            masked = old == mask_id
            if not masked.any():
                post_steps += 1
            if post_steps > max_post_steps:
                break
            x0, x0_p, probs = _draft(lm, x, end, block_length)
            filtered = _probs_from_logits(_draft_logits(lm, x, end, block_length), s)
            min_k = min(num_to_transfer, int(masked.sum()))
            edit = ~masked & ~prompt_in_block & (x0_p > editing_threshold) & (x0 != old)
            drafted = torch.where(masked | edit, x0, old)
            span = _first_run(masked.tolist())
            n_conf = int((torch.where(masked, x0_p, -torch.inf) > threshold).sum())
            update = {}
            if decide(s, state, filtered[span], n_conf) and span:  # the estimates from filtered probs
                q_all = _probs_from_logits(_verify_2l_logits(lm, x, start, end, drafted), s)
                # min(1, q / x0_p), x0_p the unfiltered softmax; the residual from the filtered draft
                accepted = accept(q_all[span], probs[span], x0[span], s, residual_p=filtered[span])
                update = {span[i]: tok for i, tok in accepted.items()}
            if len(update) < min_k:
                update |= _dynamic_fallback(masked, x0, x0_p, update, min_k - len(update), threshold)
            x[start:end][edit] = x0[edit]
            for b, t in update.items():
                x[start + b] = t
            if not masked.any() and not edit.any():
                break
    return _answer(x, P, gen_length, stop_ids)


def _draft_logits(lm, x, end, block_length):
    """The draft's logits of the block ending at ``end`` (the mask token's at -inf)."""
    logits = lm.forward(x[None, :end], mode=Full(attention_block=block_length))[0, -block_length:]
    logits[:, lm.config.mask_id] = -torch.inf
    return logits


def _verify_2l_logits(lm, x, start, end, drafted):
    """_verify_2l's logits (before its softmax)."""
    return _verify_2l(lm, x, start, end, drafted, logits=True)
