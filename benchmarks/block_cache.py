"""The exact block cache against recomputing the whole window every step, on a block-causal model.

For each method and block length: every prompt of the tasks decoded with cache="block" and with
cache="none" (batch --batch-size, greedy), the tokens compared (they must be the same), and the
wall-time ratio of the two runs (one warm-up batch each first). Prints a Markdown table.

    OMP_NUM_THREADS=1 python benchmarks/block_cache.py --model tiny-bd --data-dir DATA \\
        --task bbh:boolean_expressions --task bbh:web_of_lies --methods llada2,vanilla,cai \\
        --block-lengths 8,32
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import caidllm
from caidllm.bench.tasks import load_task


def run(lm, prompts, method, block_length, cache, gen_length, batch_size):
    # warm-up
    lm.generate(
        prompts[:batch_size],
        method=method,
        block_length=block_length,
        cache=cache,
        gen_length=gen_length,
        batch_size=batch_size,
    )
    started = time.perf_counter()
    results = lm.generate(
        prompts,
        method=method,
        block_length=block_length,
        cache=cache,
        gen_length=gen_length,
        batch_size=batch_size,
    )
    return results, time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-bd")
    p.add_argument("--task", action="append", dest="tasks", required=True)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--methods", default="llada2,vanilla,cai")
    p.add_argument("--block-lengths", default="8,32")
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    lm = caidllm.load(args.model, device="cpu", dtype="float32")
    data_dir = Path(args.data_dir) if args.data_dir else None
    prompts = [
        lm.encode_chat(s.prompt)
        for t in args.tasks
        for s in load_task(t, limit=args.limit, data_dir=data_dir).samples
    ]
    print(
        f"{len(prompts)} prompts of {', '.join(args.tasks)}; gen_length {args.gen_length}, batch "
        f"{args.batch_size}"
    )
    print(
        "| method | block | same tokens | NFE (mean) | wall, block cache (s) | wall, whole window (s) | "
        "ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for block_length in (int(b) for b in args.block_lengths.split(",")):
        for method in args.methods.split(","):
            cached, wall_cached = run(
                lm, prompts, method, block_length, "block", args.gen_length, args.batch_size
            )
            whole, wall_whole = run(
                lm, prompts, method, block_length, "none", args.gen_length, args.batch_size
            )
            same = all(a.token_ids == b.token_ids for a, b in zip(cached, whole))
            nfe = sum(r.nfe for r in cached) / len(cached)
            print(
                f"| {method} | {block_length} | {'yes' if same else 'NO'} | {nfe:.1f} | {wall_cached:.1f} | "
                f"{wall_whole:.1f} | {wall_whole / wall_cached:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
