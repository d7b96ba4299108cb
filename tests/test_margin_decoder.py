"""The top-2 margin decoder (decode/policies/margin.py), the worked example of
docs/architecture/add-a-decoder.md: its rule on a hand-made step, its greedy output equal to a plain
re-statement of the rule (no engine, no cache, one prompt at a time) on random LLaDA and Dream weights,
LLaDA's schedule kept, batch invariance."""

import torch

from caidllm.decode.policies import POLICIES, StepView
from caidllm.decode.policies.margin import select
from caidllm.decode.sampling import predict
from helpers.decoding import BLOCK, GEN, PROMPTS, run

PROMPTS = PROMPTS[:3]


def view(confidence, second, masked, step=0, total_steps=2):
    confidence = torch.tensor([confidence])
    return StepView(
        confidence=confidence,
        predicted=torch.zeros_like(confidence, dtype=torch.long),
        masked=torch.tensor([masked]),
        first_confidence=confidence,
        step=step,
        total_steps=total_steps,
        block_index=0,
        rows=torch.tensor([0]),
        state={"n_masked": torch.zeros(1, dtype=torch.long)},
        second=torch.tensor([second]),
    )


def test_the_widest_margin_wins_not_the_highest_probability():
    # Position 0 is the most probable (0.5) but its runner-up is close (0.45); position 2's margin is widest.
    v = view([0.5, 0.3, 0.4, 0.9], [0.45, 0.1, 0.05, 0.0], [True, True, True, False], total_steps=3)
    assert select(v).tolist() == [[False, False, True, False]]  # 3 masks over 3 steps: one a step
    assert POLICIES["margin"].needs_distribution  # the engine computes `second` for it


def margin_reference(lm, prompt, gen=GEN, block=BLOCK):
    """LLaDA's loop (linear schedule per block, whole canvas every step) ranking by p1 - p2."""
    mask = lm.config.mask_id
    x = torch.tensor([prompt + [mask] * gen])
    p, steps = len(prompt), block  # steps = gen_length: one step per position
    for b in range(gen // block):
        lo, hi = p + b * block, p + (b + 1) * block
        n = int((x[0, lo:hi] == mask).sum())
        for t in range(steps):
            logits = lm.logits(x)[0]
            tokens, _ = predict(logits[None].clone(), mask, 0.0, None)
            logits = logits.clone()
            logits[:, mask] = float("-inf")
            top2 = torch.softmax(logits, -1).topk(2, dim=-1).values
            margin = top2[:, 0] - top2[:, 1]
            k = n // steps + (t < n % steps)
            masked = [i for i in range(lo, hi) if x[0, i] == mask]
            for i in sorted(masked, key=lambda i: (-float(margin[i]), i))[:k]:
                x[0, i] = tokens[0, i]
    return x[0, p:].tolist()


def test_margin_matches_its_plain_loop(lm):
    results = run(lm, PROMPTS, "vanilla", policy="margin")
    for prompt, r in zip(PROMPTS, results):
        assert r.token_ids == margin_reference(lm, prompt)
        assert r.nfe == GEN  # LLaDA's schedule: one position a step at steps = gen_length


def test_margin_orders_differently_from_vanilla_and_keeps_batch_invariance(lm):
    together = run(lm, PROMPTS, "vanilla", policy="margin", batch_size=3)
    vanilla = run(lm, PROMPTS, "vanilla")
    assert any(m.trace.commit_step != v.trace.commit_step for m, v in zip(together, vanilla))
    for prompt, joint in zip(PROMPTS, together):
        (alone,) = run(lm, [prompt], "vanilla", policy="margin")
        assert alone.token_ids == joint.token_ids and alone.trace.commit_step == joint.trace.commit_step
