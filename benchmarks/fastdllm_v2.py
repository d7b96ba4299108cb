"""Fast-dLLM v2 on a random shape (CPU): its own decoder on the within-block cache ("subblock"), on
the exact block cache alone ("block") and recomputing the whole window every step ("none"),
beside vanilla and cai on the block cache.

Every run decodes the same prompts (random token ids, batch --batch-size, greedy, early stop off,
so every run decodes every position); the runs alternate in order round after round (A B C ...,
then ... C B A) and each figure is the median of its rounds. Prints a Markdown table: NFE per
request, wall time, generated tokens per second, the wall ratio against vanilla and whether the
tokens equal the whole-window run of the same decoder (the block cache is exact; the within-block
cache is not). The weights are random: the tokens mean nothing, the costs are the shape's.

    OMP_NUM_THREADS=1 python benchmarks/fastdllm_v2.py --layers 4 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import caidllm

RUNS = [
    ("fastdllm-v2", "subblock"),
    ("fastdllm-v2", "block"),
    ("fastdllm-v2", "none"),
    ("vanilla", "block"),
    ("cai", "block"),
]


def decode(lm, prompts, method, cache, args):
    started = time.perf_counter()
    results = lm.generate(
        prompts,
        method=method,
        cache=cache,
        gen_length=args.gen_length,
        block_length=32,
        early_stop=False,
        batch_size=args.batch_size,
    )
    return results, time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="fastdllm-v2-1.5b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-length", type=int, default=40)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    lm = caidllm.load(f"random:{args.shape}?num_hidden_layers={args.layers}", device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, 5000, (args.prompt_length,), generator=g).tolist() for _ in range(args.prompts)
    ]
    decode(lm, prompts[:1], "fastdllm-v2", "subblock", args)  # warm-up
    walls = {run: [] for run in RUNS}
    outputs = {}
    for r in range(args.rounds):
        for run in RUNS if r % 2 == 0 else RUNS[::-1]:
            outputs[run], wall = decode(lm, prompts, *run, args)
            walls[run].append(wall)
            print(f"round {r} {run}: {wall:.1f} s", flush=True)
    vanilla = statistics.median(walls[("vanilla", "block")])
    print(
        f"\n{args.shape} with {args.layers} layers, {len(prompts)} prompts of {args.prompt_length} tokens, "
        f"gen_length {args.gen_length}, block 32, batch {args.batch_size}, {args.rounds} rounds (median)\n"
    )
    print(
        "| method | cache | NFE per request | wall (s) | tokens/s | wall ratio vs vanilla "
        "| same tokens as no cache |"
    )
    print("|---|---|---|---|---|---|---|")
    for run in RUNS:
        method, cache = run
        wall = statistics.median(walls[run])
        nfe = sum(x.nfe for x in outputs[run]) / len(prompts)
        reference = outputs.get((method, "none"))
        same = (
            "-"
            if reference is None
            else ("yes" if all(a.token_ids == b.token_ids for a, b in zip(outputs[run], reference)) else "no")
        )
        print(
            f"| {method} | {cache} | {nfe:.1f} | {wall:.1f} | {len(prompts) * args.gen_length / wall:.2f} | "
            f"{vanilla / wall:.2f}x | {same} |"
        )


if __name__ == "__main__":
    main()
