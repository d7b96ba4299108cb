"""A plain re-statement of KLASS's official LLaDA loop (shkim0116/KLASS, ``src/model/llada_klass.py``,
``stable_confident_decode``, ``alg="klass"``, ``unmask_strategy="all"``, greedy) for parity tests: one
prompt, the whole canvas every step, no engine.

Per block: n masks counted at its start, LLaDA's linear schedule over its steps; a step with no mask left
in the block runs no forward. Every step: the float64 softmax of every position, its KL from the previous
step's (sum p (log(p + 1e-12) - log(q + 1e-12)), q all zeros before the first forward) pushed on a history
of the last `history` KLs; from the block's step `history - 1` on, a position is stable when all of them
are below the KL threshold; the masked block positions that are stable and whose best probability is
strictly above the confidence threshold are committed, all of them; with none, the schedule's k most
confident. caidllm's reading of the mask token is kept (never predicted: its logit -inf before the
softmax); `first_step_kl="unknown"` is caidllm's other reading (a block's first step has no previous
distribution: unstable), `"official"` compares with the previous forward as the official code does.
"""

from __future__ import annotations

import torch


def klass_reference(
    lm, prompt, gen, block, steps, conf_threshold, kl_threshold, history, first_step_kl="official"
):
    mask = lm.config.mask_id
    x = torch.tensor([prompt + [mask] * gen])
    p, steps_per_block = len(prompt), steps // (gen // block)
    previous = None  # the official's p_prev: zeros before the first forward
    kls: list[torch.Tensor] = []
    for b in range(gen // block):
        lo, hi = p + b * block, p + (b + 1) * block
        n = int((x[0, lo:hi] == mask).sum())
        for t in range(steps_per_block):
            masked = x[0, lo:hi] == mask
            if not masked.any():
                break
            logits = lm.logits(x)[0].double()
            logits[:, mask] = float("-inf")
            probs = torch.softmax(logits, -1)
            old = torch.zeros_like(probs) if previous is None else previous
            kl = (probs * ((probs + 1e-12).log() - (old + 1e-12).log())).sum(-1)
            if t == 0 and first_step_kl == "unknown":
                kl = torch.full_like(kl, float("inf"))
            kls = (kls + [kl])[-history:]
            previous = probs
            stable = torch.stack(kls).lt(kl_threshold).all(0)
            if t < history - 1:  # too few steps in the block
                stable = torch.zeros_like(stable)
            confidence, tokens = probs.max(-1)
            ready = [
                i for i in range(lo, hi) if masked[i - lo] and stable[i] and confidence[i] > conf_threshold
            ]
            if not ready:
                k = n // steps_per_block + (t < n % steps_per_block)
                candidates = [i for i in range(lo, hi) if masked[i - lo]]
                ready = sorted(candidates, key=lambda i: (-float(confidence[i]), i))[:k]
            for i in ready:
                x[0, i] = tokens[i]
    return x[0, p:].tolist()
