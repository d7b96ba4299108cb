"""A plain re-statement of LocalLeap's official LLaDA loop (friedrichor/LocalLeap, LLaDA ``generate.py``:
``generate`` with ``threshold`` and ``relaxed_threshold``, greedy, ``early_stop=False``; read in a public
mirror, docs/decoder-fidelity.md) for parity tests: one prompt, the whole canvas every step, no engine.

Per block, until the block has no mask: one forward; the argmax and its float64 softmax probability at
every masked position up to the block's end (-inf elsewhere); the masked positions in descending order of
confidence (`torch.topk`); the first always commits; anchors are the masked positions at or above
`threshold`, their neighbourhood every position within `radius` of one (clipped to the canvas); each later
position commits when its confidence reaches `relaxed` inside a neighbourhood, else `threshold`. caidllm's
reading of the mask token is kept (never predicted: its logit -inf before the argmax and the softmax).
Returns the generated tokens and the number of forwards.
"""

from __future__ import annotations

import torch


def localleap_reference(lm, prompt, gen, block, threshold, relaxed, radius):
    mask = lm.config.mask_id
    x = torch.tensor([prompt + [mask] * gen])
    p, width, forwards = len(prompt), len(prompt) + gen, 0
    for b in range(gen // block):
        end = p + (b + 1) * block
        while (x[0, p + b * block : end] == mask).any():
            forwards += 1
            logits = lm.logits(x)[0].double()
            logits[:, mask] = float("-inf")
            tokens = logits.argmax(-1)
            probability = torch.softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
            masked = (x[0] == mask) & (torch.arange(width) < end)
            confidence = torch.where(masked, probability, torch.tensor(float("-inf"), dtype=torch.float64))
            order = torch.topk(confidence, k=int(masked.sum())).indices.tolist()
            neighbours = set()
            if relaxed is not None:
                for q in torch.where(masked & (confidence >= threshold))[0].tolist():
                    neighbours.update(range(max(0, q - radius), min(width, q + radius + 1)))
            chosen = [order[0]] + [
                q for q in order[1:] if confidence[q] >= (relaxed if q in neighbours else threshold)
            ]
            x[0, chosen] = tokens[chosen]
    return x[0, p:].tolist(), forwards
