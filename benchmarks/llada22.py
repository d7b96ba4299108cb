"""LLaDA2.2 on a random reduced shape (CPU): block routing against token routing (distinct experts read per
block), and the InDel decoder's forwards and edits per block beside LLaDA2.1's speed mode.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/llada22.py [--prompts 4] [--gen 64]

The shape: LLaDA2.2-flash's routing (256 experts, top-8, a pool of 48 per block of 32, 8 groups of which 4 for
token routing) on small layers (hidden 64, 3 layers of which 2 MoE). Random weights: their router spreads
tokens evenly, so token routing's footprint here is an upper figure (the report finds real blocks
concentrated); block routing's is bounded by the pool whatever the weights.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

import torch

import caidllm
from caidllm.decode.policies import indel
from caidllm.models.moe import MoEFeedForward
from caidllm.models.moe_block_routing import context_groups

SHAPE = (
    "random:llada2.2-flash?num_hidden_layers=3&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
    "&head_dim=16&rotary_dim=8&intermediate_size=128&moe_intermediate_size=16&max_position_embeddings=1024"
)


def experts_per_block(capacity: int, prompts, gen: int) -> list[int]:
    """Distinct experts each block's real positions read, per MoE layer and forward (llada2 decoding)."""
    # capacity 0: token routing (LLaDA2.0 / 2.1's group-limited top-k), the same weights (seed 0)
    lm = caidllm.load(f"{SHAPE}&expert_capacity={capacity}", device="cpu", dtype="float32")
    counts, original = [], MoEFeedForward.forward

    def counting(self, x, ctx=None):
        groups = context_groups(ctx, 32)
        experts, _ = self.gate(x.reshape(-1, x.shape[-1]), groups if self.config.expert_capacity else None)
        for g in groups.unique().tolist():
            if g:  # block 0 is padding
                counts.append(experts[groups == g].unique().numel())
        return original(self, x, ctx)

    MoEFeedForward.forward = counting
    try:
        lm.generate(prompts, gen_length=gen, method="llada2")
    finally:
        MoEFeedForward.forward = original
    return counts


def indel_blocks(prompts, gen: int, edit_scale: float):
    """Forwards per block of llada2.2 and llada2.1-speed, and DELETE / SPLIT per block of llada2.2."""
    lm = caidllm.load(f"{SHAPE}&expert_capacity=48", device="cpu", dtype="float32")
    with torch.no_grad():
        lm.model.lm_head.weight[list(lm.config.edit_tokens)] *= edit_scale
    edits, original = Counter(), indel.apply_edits

    def counting(block, before, flags, prompt_len, ids):
        edits["delete"] += sum(t == ids.delete for t in block[prompt_len:])
        edits["split"] += sum(t == ids.split for t in block[prompt_len:])
        return original(block, before, flags, prompt_len, ids)

    indel.apply_edits = counting
    try:
        ours = lm.generate(prompts, gen_length=gen, method="llada2.2", early_stop=False)
    finally:
        indel.apply_edits = original
    speed = lm.generate(prompts, gen_length=gen, method="llada2.1-speed", early_stop=False)
    blocks = sum(len(r.steps_per_block) for r in ours)
    return (
        statistics.mean(s for r in ours for s in r.steps_per_block),
        statistics.mean(s for r in speed for s in r.steps_per_block),
        edits["delete"] / blocks,
        edits["split"] / blocks,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--gen", type=int, default=64)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 1000, (n,), generator=g).tolist() for n in (7, 20, 33, 45)[: args.prompts]]
    print("| routing | experts per block: mean | max | blocks x layers x forwards |")
    print("|---|---|---|---|")
    for name, capacity in (("token (group-limited top-8)", 0), ("block (pool 48)", 48)):
        counts = experts_per_block(capacity, prompts, args.gen)
        print(f"| {name} | {statistics.mean(counts):.1f} | {max(counts)} | {len(counts)} |")
    print()
    print("| edit logits | llada2.2 forwards per block | llada2.1-speed | DELETE per block | SPLIT |")
    print("|---|---|---|---|---|")
    for scale in (1.0, 30.0):
        f22, f21, deletes, splits = indel_blocks(prompts, args.gen, scale)
        print(f"| x{scale:g} | {f22:.1f} | {f21:.1f} | {deletes:.2f} | {splits:.2f} |")


if __name__ == "__main__":
    main()
