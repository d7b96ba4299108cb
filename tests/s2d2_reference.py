"""A plain re-statement of S2D2 as phymhan/S2D2 ships it (SDAR/generate_ssd_policy.py
``block_diffusion_generate`` and LLaDA2/generate_utils.py ``generate_ssd_policy``, the same loop; and
Fast-dLLM-v2/generate_policy_utils.py ``generate_ssd_policy`` over fdv2_reference.py's official forward), for
parity tests: batch 1, no cache (the whole window every step, as bd_reference.py), torch's global RNG
seeded with the engine's per-request seed (sampling.row_seed), so the acceptance draws are the same.

Per step: the draft (argmax, its float32 softmax probability); the first contiguous run of masks; the
router (mask_span_length / score_threshold / score_hysteresis, E[K] from the run's estimator); the verify
forward (the 2L trick: the draft-filled block, causal, and a copy of masks, shadow i seeing the block
strictly before i and itself; Fast-dLLM v2: the draft-filled block causal, shifted logits); acceptance
``torch.rand(S) < min(1, q / p)``, the first rejection drawn from (q - p)+; the fallback base rule.

caidllm's readings kept here (rows of docs/decoder-fidelity.md): the mask token is never predicted (its
logit -inf in the draft and the verify distributions); no LLaDA2.1 token editing (the shipped LLaDA2 loop
edits, and then spends one more draft forward per block with nothing left to decode: NFE only); the
greedy acceptance switch (``acceptance="greedy"``).
"""

from __future__ import annotations

import torch

from bd_reference import _answer, _canvas, transfer_schedule
from caidllm.decode.sampling import row_seed
from caidllm.models.modes import Full
from fdv2_reference import OfficialFastDLLMv2


def _softmax(logits):
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


def _estimates(probs, s):
    if s["estimator"] == "hard_margin_threshold":
        top2 = torch.topk(probs, k=2, dim=-1).values
        return ((top2[:, 0] - top2[:, 1]) > s["margin_threshold"]).to(probs.dtype)
    if s["estimator"] == "soft_entropy_negexp":
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)
        return torch.exp(
            -s["entropy_temperature"] * entropy / torch.log(torch.tensor(float(probs.shape[-1])))
        )
    return (probs**2).sum(dim=-1).clamp(0.0, 1.0)


def decide(s, state, span_probs, n_confident):
    """The official _decide_do_verify for the three routers."""
    if s["router"] == "mask_span_length":
        return span_probs.shape[0] >= s["min_span"]
    score = float("-inf")
    if span_probs.shape[0]:
        expected = float(torch.cumprod(_estimates(span_probs, s).clamp(0.0, 1.0), dim=0).sum().item())
        c = s["penalty"]
        score = expected - c * n_confident if s["score"] == "difference_dynamic" else expected - c
    if s["router"] == "score_threshold":
        return not score < s["score_threshold"]
    state["on"] = (not score < s["hysteresis_off"]) if state["on"] else bool(score > s["hysteresis_on"])
    return state["on"]


def accept(q_probs, p_probs, draft, s):
    """Tokens of the run to commit: accepted prefix, the first rejection resampled from (q - p)+."""
    if s["acceptance"] == "greedy":
        best = q_probs.argmax(-1)
        n = next((i for i in range(len(draft)) if int(best[i]) != int(draft[i])), len(draft))
        return draft[:n].tolist() + best[n : n + 1].tolist()
    p_sel = p_probs.gather(-1, draft[:, None])[:, 0].clamp_min(1e-12)
    q_sel = q_probs.gather(-1, draft[:, None])[:, 0].clamp_min(0.0)
    ratios = (q_sel / p_sel).clamp(max=1.0)
    flags = torch.rand((ratios.shape[0],), dtype=ratios.dtype) < ratios
    reject = (~flags).nonzero(as_tuple=True)[0]
    if reject.numel() == 0:
        return draft.tolist()
    n = int(reject[0])
    delta = (q_probs[n] - p_probs[n]).clamp_min(0.0)
    z = float(delta.sum().item())
    if z <= 0.0 or not torch.isfinite(delta).all():
        token = torch.multinomial(q_probs[n].clamp_min(0).float(), num_samples=1)
    else:
        token = torch.multinomial((delta / z).float(), num_samples=1)
    return draft[:n].tolist() + [int(token)]


def _draft(lm, x, end, block_length):
    logits = lm.forward(x[None, :end], mode=Full(attention_block=block_length))[0, -block_length:]
    logits[:, lm.config.mask_id] = -torch.inf
    probs = _softmax(logits)
    x0 = logits.argmax(-1)
    return x0, probs.gather(-1, x0[:, None])[:, 0], probs


def _verify_2l(lm, x, start, end, drafted):
    """The shadow half's distributions [L, V] of the 2L verifier over the whole window (no cache)."""
    L, n = end - start, end
    ids = torch.cat([x[:start], drafted, torch.full((L,), lm.config.mask_id)])[None]
    positions = torch.cat([torch.arange(end), torch.arange(start, end)])[None]
    blocks = torch.arange(start) // L
    att = torch.zeros(n + L, n + L, dtype=torch.bool)
    att[:start, :start] = blocks[None, :] <= blocks[:, None]  # the earlier blocks, block-causal
    att[start:, :start] = True
    tril = torch.ones(L, L, dtype=torch.bool).tril()
    att[start:n, start:n] = tril
    att[n:, start:n] = tril.tril(-1)
    att[n:, n:] = torch.eye(L, dtype=torch.bool)
    targets = torch.arange(n, n + L)[None]
    logits = lm.forward_with_attention(ids, positions, att[None, None], targets)[0]
    logits[:, lm.config.mask_id] = -torch.inf
    return _softmax(logits)


def s2d2_generate(
    lm, prompt, *, gen_length, block_length, steps, threshold, s, num_to_transfer=None, seed=0, stop_ids=()
):
    """SDAR's / LLaDA2's S2D2 loop (num_to_transfer: LLaDA2's fixed quota; None: SDAR's schedule)."""
    torch.manual_seed(row_seed(seed, list(prompt)))
    mask_id = lm.config.mask_id
    P, num_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
    schedule = transfer_schedule(block_length, steps)
    state = {"on": False}
    for block in range(P // block_length, num_blocks):
        start, end = block * block_length, (block + 1) * block_length
        for step in range(steps + 1):
            masked = x[start:end] == mask_id
            if not masked.any():
                break
            x0, x0_p, probs = _draft(lm, x, end, block_length)
            quota = num_to_transfer if num_to_transfer is not None else schedule[step]
            min_k = min(quota, int(masked.sum()))
            span = _first_run(masked.tolist())
            n_conf = int(((torch.where(masked, x0_p, -torch.inf)) > threshold).sum())
            update = {}
            if span and decide(s, state, probs[span], n_conf):
                drafted = torch.where(masked, x0, x[start:end])
                q = _verify_2l(lm, x, start, end, drafted)[span]
                update = dict(zip(span, accept(q, probs[span], x0[span], s)))
            if len(update) < min_k:
                update |= _dynamic_fallback(masked, x0, x0_p, update, min_k - len(update), threshold)
            for b, t in update.items():
                x[start + b] = t
        if any(int(t) in stop_ids for t in x[P:end]):
            break
    return _answer(x, P, gen_length, stop_ids)


def _first_run(flags):
    if True not in flags:
        return []
    i = flags.index(True)
    j = i
    while j < len(flags) and flags[j]:
        j += 1
    return list(range(i, j))


def _dynamic_fallback(masked, x0, x0_p, update, k_left, threshold):
    remaining = masked.clone()
    for b in update:
        remaining[b] = False
    confidence = torch.where(remaining, x0_p, -torch.inf)
    k = min(k_left, int(remaining.sum()))
    if k <= 0:
        return {}
    high = confidence > threshold
    chosen = high.nonzero(as_tuple=True)[0] if int(high.sum()) >= k else torch.topk(confidence, k).indices
    return {int(b): int(x0[b]) for b in chosen}


class OfficialFastDLLMv2S2D2(OfficialFastDLLMv2):
    """Fast-dLLM-v2/generate_policy_utils.py ``generate_ssd_policy`` (use_block_cache, cache_ver, draft_ver
    off, as the paper's Fast-dLLM v2 configurations run it) over fdv2_reference.py's official forward."""

    def generate_s2d2(
        self, prompt, max_new_tokens, *, threshold, small_block_size, block_size, stop_ids, s, seed=0
    ):
        """The official S2D2 loop: fdv2_reference's generate with S2D2's sub-block step."""
        torch.manual_seed(row_seed(seed, list(prompt)))
        state = {"on": False}

        def step(x, lo, sb, size, past):
            self._sub_block_step(x, lo, sb, size, past, threshold, s, state)

        return self.generate(
            prompt,
            max_new_tokens,
            threshold=threshold,
            small_block_size=small_block_size,
            block_size=block_size,
            stop_ids=stop_ids,
            use_block_cache=False,
            step=step,
            next_token=self._next_token,
        )

    def _next_token(self, logits):
        """The next block's first token, the mask token never predicted (caidllm's reading)."""
        last = logits[-1:].clone()
        last[:, self.mask_id] = float("-inf")
        return last.argmax(-1)

    def _sub_block_step(self, x, lo, sb, size, past, threshold, s, state):
        logits = self._step_logits(x, lo, sb, size, past, False, None).clone()
        logits[:, self.mask_id] = float("-inf")
        probs = logits.softmax(-1)
        x1 = probs.argmax(-1)
        x1_p = probs.gather(-1, x1[:, None])[:, 0]
        sub = x[lo + sb : lo + sb + size]
        seg = sub == self.mask_id
        span = _first_run(seg.tolist())
        n_conf = int(((x1_p > threshold) & seg).sum())
        if not decide(s, state, probs[span], n_conf):
            conf = torch.where(seg, x1_p, torch.tensor(-torch.inf))
            take = conf > threshold
            take[conf.argmax()] = True
            sub[take] = x1[take]
            return
        ver = x[lo : lo + sb + size].clone()
        ver[sb : sb + size][seg] = x1[seg]
        v = self.forward(ver, past, block_size=1)
        v = torch.cat([v[:1], v[:-1]])[torch.tensor(span) + sb]
        v[:, self.mask_id] = float("-inf")
        tokens = accept(v.softmax(-1), probs[span], x1[span], s)
        for b, t in zip(span, tokens):
            sub[b] = t
