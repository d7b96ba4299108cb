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

SDAR's AR-like caching (``s["cache_ver"]``, ``s["draft_ver"]``): with cache_ver the official loop fills its
cache with the causal verifier mask (the prefill, each finished block's write), so here the window's rows
before the current block read token-causally, in the draft and in the verify forward; with draft_ver the
draft's rows of the block's decoded prefix (before its first mask) too, and without cache_ver each finished
block is written with the mask its last draft step left (in place): its prefix then, token-causal.

caidllm's readings kept here (rows of docs/decoder-fidelity.md): the mask token is never predicted (its
logit -inf in the draft and the verify distributions); the greedy acceptance switch
(``acceptance="greedy"``). LLaDA2's loop with its token editing: s2d2_llada2_reference.py (without editing
it is this loop).
"""

from __future__ import annotations

import math

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


def _bin(value, vmin, vmax, n):
    if n <= 1 or vmax <= vmin:
        return 0
    value = min(max(float(value), vmin), vmax)
    return min(n - 1, max(0, int((value - vmin) / (vmax - vmin) * n)))


def _mean_entropy(probs):
    if probs.numel() == 0 or probs.shape[-1] <= 1:
        return 0.0
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)
    return float((entropy / torch.log(torch.tensor(float(probs.shape[-1]), dtype=probs.dtype))).mean().item())


def bandit(s, state, span_probs, masked_probs, unmasked, block_length):
    """The official contextual_bandit_ucb branch: (do_verify, action, bucket)."""
    if "count" not in state:
        n = s["ucb_span_bins"] * s["ucb_progress_bins"] * s["ucb_entropy_bins"]
        state |= {"count": [[0] * n, [0] * n], "reward_sum": [[0.0] * n, [0.0] * n], "decision_t": 0}
    state["decision_t"] += 1
    source = span_probs if s.get("ucb_entropy_source", "span") == "span" else masked_probs
    entropy = _mean_entropy(source) if source.numel() > 0 else 0.0
    progress = min(1.0, max(0.0, unmasked / max(1, block_length)))
    span_bin = _bin(max(1, span_probs.shape[0]), 1.0, float(max(1, block_length)), s["ucb_span_bins"])
    progress_bin = _bin(progress, 0.0, 1.0, s["ucb_progress_bins"])
    entropy_bin = _bin(entropy, 0.0, 1.0, s["ucb_entropy_bins"])
    bucket = (span_bin * s["ucb_progress_bins"] + progress_bin) * s["ucb_entropy_bins"] + entropy_bin
    log_t = math.log(max(1, state["decision_t"]))
    scores = []
    for action in (0, 1):
        n_ab = state["count"][action][bucket]
        if n_ab == 0:
            scores.append(float("inf"))
            continue
        bonus = 0.0 if log_t <= 0.0 else s["ucb_beta"] * math.sqrt(log_t / n_ab)
        scores.append(state["reward_sum"][action][bucket] / n_ab + bonus)
    action = 1 if scores[1] >= scores[0] else 0
    return action == 1, action, bucket


def decide(s, state, span_probs, n_confident):
    """The official _decide_do_verify for the three score / span routers."""
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


def accept(q_probs, p_probs, draft, s, fastdllm=False, residual_p=None):
    """{span offset: token} to commit: accepted prefix, the first rejection resampled from (q - p)+
    (allow_resample; without it SDAR's loop commits the draft there, Fast-dLLM v2's nothing), then
    SDAR's ssd_ratio_threshold over the span's later positions."""
    p_sel = p_probs.gather(-1, draft[:, None])[:, 0].clamp_min(1e-12)
    q_sel = q_probs.gather(-1, draft[:, None])[:, 0].clamp_min(0.0)
    ratios = (q_sel / p_sel).clamp(max=1.0)
    if s["acceptance"] == "greedy":
        flags = q_probs.argmax(-1) == draft
    else:
        flags = torch.rand((ratios.shape[0],), dtype=ratios.dtype) < ratios
    reject = (~flags).nonzero(as_tuple=True)[0]
    if reject.numel() == 0:
        return {i: int(t) for i, t in enumerate(draft)}
    n = int(reject[0])
    update = {i: int(draft[i]) for i in range(n)}
    if not s.get("resample", True):
        if not fastdllm:
            update[n] = int(draft[n])
    elif s["acceptance"] == "greedy":
        update[n] = int(q_probs[n].argmax())
    else:
        delta = (q_probs[n] - (p_probs if residual_p is None else residual_p)[n]).clamp_min(0.0)
        z = float(delta.sum().item())
        if z <= 0.0 or not torch.isfinite(delta).all():
            token = torch.multinomial(q_probs[n].clamp_min(0).float(), num_samples=1)
        else:
            token = torch.multinomial((delta / z).float(), num_samples=1)
        update[n] = int(token)
    thr = s.get("ratio_threshold", -1.0)
    for i in range(len(draft)):
        if thr >= 0 and i not in update and i > n and float(ratios[i]) >= thr:
            update[i] = int(draft[i])
    return update


def _window_attention(n, block_length, causal_rows):
    """[n, n] bool: block-causal, the rows set in ``causal_rows`` [n] token-causal (AR-like caching)."""
    blocks = torch.arange(n) // block_length
    att = blocks[None, :] <= blocks[:, None]
    att[causal_rows] = torch.ones(n, n, dtype=torch.bool).tril()[causal_rows]
    return att


def _draft(lm, x, end, block_length, causal_rows=None):
    """The draft's argmax, its probability and the distributions of the block ending at ``end``;
    ``causal_rows`` [end] (AR-like caching): the window's rows that read token-causally, as the cache the
    official loop fills holds them (cache_ver: its causal verifier mask; draft_ver alone: the rows its last
    draft step made causal in its block mask, in place) and the block's decoded prefix (draft_ver: its rows
    of cur_attn_mask replaced by the causal mask's)."""
    if causal_rows is None:
        logits = lm.forward(x[None, :end], mode=Full(attention_block=block_length))[0, -block_length:]
    else:
        att = _window_attention(end, block_length, causal_rows)[None, None]
        positions = torch.arange(end)[None]
        logits = lm.forward_with_attention(x[None, :end], positions, att, positions[:, -block_length:])[0]
    logits[:, lm.config.mask_id] = -torch.inf
    probs = _softmax(logits)
    x0 = logits.argmax(-1)
    return x0, probs.gather(-1, x0[:, None])[:, 0], probs


def _verify_2l(lm, x, start, end, drafted, cache_rows=None, logits=False):
    """The shadow half's distributions [L, V] of the 2L verifier over the whole window (no cache; the
    earlier blocks' rows set in ``cache_rows`` [start] token-causal, as the official cache then holds
    them)."""
    L, n = end - start, end
    ids = torch.cat([x[:start], drafted, torch.full((L,), lm.config.mask_id)])[None]
    positions = torch.cat([torch.arange(end), torch.arange(start, end)])[None]
    blocks = torch.arange(start) // L
    att = torch.zeros(n + L, n + L, dtype=torch.bool)
    att[:start, :start] = blocks[None, :] <= blocks[:, None]  # the earlier blocks, block-causal
    if cache_rows is not None:  # the rows the official loop wrote with a causal mask
        att[:start, :start][cache_rows] = torch.ones(start, start, dtype=torch.bool).tril()[cache_rows]
    att[start:, :start] = True
    tril = torch.ones(L, L, dtype=torch.bool).tril()
    att[start:n, start:n] = tril
    att[n:, start:n] = tril.tril(-1)
    att[n:, n:] = torch.eye(L, dtype=torch.bool)
    targets = torch.arange(n, n + L)[None]
    out = lm.forward_with_attention(ids, positions, att[None, None], targets)[0]
    out[:, lm.config.mask_id] = -torch.inf
    return out if logits else _softmax(out)


def s2d2_generate(
    lm, prompt, *, gen_length, block_length, steps, threshold, s, num_to_transfer=None, seed=0, stop_ids=()
):
    """SDAR's / LLaDA2's S2D2 loop (num_to_transfer: LLaDA2's fixed quota; None: SDAR's schedule)."""
    torch.manual_seed(row_seed(seed, list(prompt)))
    mask_id = lm.config.mask_id
    P, num_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
    schedule = transfer_schedule(block_length, steps)
    state = {"on": False}
    ar_like = s.get("cache_ver") or s.get("draft_ver")
    written = torch.zeros(len(x), dtype=torch.bool)  # draft_ver alone: the rows written token-causally
    for block in range(P // block_length, num_blocks):
        start, end = block * block_length, (block + 1) * block_length
        unmasked = 0  # block_unmasked_count
        prefix = 0  # draft_ver: the block's decoded prefix at its last draft step
        for step in range(steps + 1):
            masked = x[start:end] == mask_id
            if not masked.any():
                break
            rows = None
            if ar_like:
                rows = written[:end].clone()
                prefix = _first_run(masked.tolist())[0] if s.get("draft_ver") else 0
                rows[start : start + prefix] = True
                if s.get("cache_ver"):  # prefill and each finished block stored with the causal mask
                    rows[:start] = True
            x0, x0_p, probs = _draft(lm, x, end, block_length, rows)
            quota = num_to_transfer if num_to_transfer is not None else schedule[step]
            min_k = min(quota, int(masked.sum()))
            span = _first_run(masked.tolist())
            n_conf = int(((torch.where(masked, x0_p, -torch.inf)) > threshold).sum())
            update, choice = {}, None
            if s["router"] == "contextual_bandit_ucb":
                left = masked.nonzero(as_tuple=True)[0]
                verify, *choice = bandit(s, state, probs[span], probs[left], unmasked, block_length)
            else:
                verify = bool(span) and decide(s, state, probs[span], n_conf)
            if verify:
                drafted = torch.where(masked, x0, x[start:end])
                q_all = _verify_2l(lm, x, start, end, drafted, None if rows is None else rows[:start])
                update = {span[i]: tok for i, tok in accept(q_all[span], probs[span], x0[span], s).items()}
                if s.get("ratio_threshold", -1.0) >= 0 and s.get(
                    "ratio_all_masks"
                ):  # ssd_threshold_all_spans
                    for b in masked.nonzero(as_tuple=True)[0].tolist():
                        q_sel = float(q_all[b, x0[b]].clamp_min(0.0))
                        ratio = min(q_sel / max(float(x0_p[b]), 1e-12), 1.0)
                        if b not in update and ratio >= s["ratio_threshold"]:
                            update[b] = int(x0[b])
            if s.get("always_check_high_confidence"):
                left = [b for b in range(block_length) if masked[b] and b not in update]
                update |= {b: int(x0[b]) for b in left if float(x0_p[b]) > threshold}
            if len(update) < min_k:
                update |= _dynamic_fallback(masked, x0, x0_p, update, min_k - len(update), threshold)
            if choice:
                state["count"][choice[0]][choice[1]] += 1
                state["reward_sum"][choice[0]][choice[1]] += len(update) / (2.0 if verify else 1.0)
            unmasked += len(update)
            for b, t in update.items():
                x[start + b] = t
        written[start : start + prefix] = True  # the block's write, with the mask its last step left
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
        if decide(s, state, probs[span], n_conf):
            ver = x[lo : lo + sb + size].clone()
            ver[sb : sb + size][seg] = x1[seg]
            v = self.forward(ver, past, block_size=1)
            v = torch.cat([v[:1], v[:-1]])[torch.tensor(span) + sb]
            v[:, self.mask_id] = float("-inf")
            update = accept(v.softmax(-1), probs[span], x1[span], s, fastdllm=True)
            for i, t in update.items():
                sub[span[i]] = t
            if update:
                return
        # no verification, or nothing committed (the first draft rejected, no resampling): the threshold rule
        conf = torch.where(seg, x1_p, torch.tensor(-torch.inf))
        take = conf > threshold
        take[conf.argmax()] = True
        sub[take] = x1[take]
