"""The prefix store off and on, alternating round by round on the same prompts (one process, one model).

For each task: its prompts (--fewshot shots, the task's own first examples) decoded with generate() in
batches of --batch-size, the store off then on (each on-run from an empty store), --rounds times; per run
the wall time, the time inside the model forwards, forwards per request and prompt positions reused; the
tokens must be the same. Prints a Markdown table.

    OMP_NUM_THREADS=1 python benchmarks/prefix_cache_ab.py --model tiny-bd --data-dir DATA \\
        --task bbh:web_of_lies --task bbh:boolean_expressions --fewshot 3 --limit 64 --no-early-stop
"""

from __future__ import annotations

import argparse
import time

import caidllm
from caidllm.bench.tasks import load_task
from caidllm.decode.prefix_reuse import forget_store


def run(lm, prompts, budget, args):
    forget_store(lm)
    started = time.perf_counter()
    results = lm.generate(
        prompts,
        method=args.method,
        gen_length=args.gen_length,
        block_length=args.block_length,
        early_stop=not args.no_early_stop,
        batch_size=args.batch_size,
        chat=False,
        prefix_cache_mb=budget,
    )
    return results, time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-bd")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--task", action="append", required=True)
    p.add_argument("--fewshot", type=int, default=3)
    p.add_argument("--limit", type=int, default=64)
    p.add_argument("--method", default="llada2")
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--no-early-stop", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prefix-cache-mb", type=float, default=256)
    args = p.parse_args()
    lm = caidllm.load(args.model, device="cpu", dtype="float32")
    print("| Task | Round | Store | Wall (s) | Forwards (s) | NFE/request | Reused/request | Same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.task:
        task = load_task(spec, data_dir=args.data_dir, limit=args.limit, fewshot=args.fewshot)
        prompts = [lm.encode_chat(s.prompt) for s in task.samples]
        run(lm, prompts[: args.batch_size], 0, args)  # warm-up
        reference = None
        for r in range(args.rounds):
            for budget in (0, args.prefix_cache_mb):
                results, wall = run(lm, prompts, budget, args)
                tokens = [x.token_ids for x in results]
                reference = reference or tokens
                n = len(results)
                print(
                    f"| {spec} | {r + 1} | {'off' if budget == 0 else f'{budget:g} MB'} | {wall:.1f} | "
                    f"{results[0].forward_s:.1f} | {sum(x.nfe for x in results) / n:.1f} | "
                    f"{sum(x.reused_positions for x in results) / n:.1f} | {tokens == reference} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
