"""A plain re-statement of Prophet's official LLaDA loop (pixeli99/Prophet, ``generate_earlyexit.py``,
``generate`` with ``analyze_gap=True``, greedy, no CFG) for parity tests: one prompt, the whole canvas every
step, no engine.

Per block LLaDA's linear schedule; every step (counted from 1 over the whole run) first reads the mean
gap between the two largest logits over the 5 positions from the answer start (cut at the canvas's end),
and when it reaches the phase's threshold (the share of all steps done: < 0.33 early, < 0.67 mid, else
late) every mask left in the canvas takes this step's argmax and decoding stops; else the schedule's
most confident masked positions of the block are committed. caidllm's reading of the mask token is kept
(never predicted: its logit -inf before the gap, the argmax and the softmax). Returns the tokens and the
number of forwards.
"""

from __future__ import annotations

import torch


def prophet_reference(lm, prompt, gen, block, steps, answer_start, thresholds=(7.5, 5.0, 2.5)):
    mask = lm.config.mask_id
    x = torch.tensor([prompt + [mask] * gen])
    p, num_blocks = len(prompt), gen // block
    steps_per_block = steps // num_blocks
    answer = p + (answer_start if answer_start >= 0 else gen + answer_start)
    global_step = 0
    for b in range(num_blocks):
        lo, hi = p + b * block, p + (b + 1) * block
        n = int((x[0, lo:hi] == mask).sum())
        for t in range(steps_per_block):
            global_step += 1
            logits = lm.logits(x)[0].float().clone()
            logits[:, mask] = float("-inf")
            tokens = logits.argmax(-1)
            positions = [q for q in range(answer, min(p + gen, answer + 5)) if q >= p]
            if positions:
                gaps = [float(logits[q].topk(2).values[0] - logits[q].topk(2).values[1]) for q in positions]
                progress = global_step / steps
                phase = 0 if progress < 0.33 else 1 if progress < 0.67 else 2
                threshold = thresholds[phase]
                if sum(gaps) / len(gaps) >= threshold:
                    x[0] = torch.where(x[0] == mask, tokens, x[0])
                    return x[0, p:].tolist(), global_step
            confidence = torch.softmax(logits, -1).max(-1).values
            k = n // steps_per_block + (t < n % steps_per_block)
            masked = [i for i in range(lo, hi) if x[0, i] == mask]
            for i in sorted(masked, key=lambda i: (-float(confidence[i]), i))[:k]:
                x[0, i] = tokens[i]
    return x[0, p:].tolist(), global_step
