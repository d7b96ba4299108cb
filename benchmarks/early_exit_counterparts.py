"""LocalLeap and CAI with Prophet's exit beside their counterparts without the new rule: accuracy and
forwards per question on the same questions (no timing). Prints a Markdown table.

    OMP_NUM_THREADS=1 python benchmarks/early_exit_counterparts.py --task synthetic:boolean_expressions \\
        --limit 32
"""

from __future__ import annotations

import argparse

import caidllm
from caidllm.bench.tasks import load_task

RUNS = [
    ("localleap", {}),
    ("fastdllm", dict(cache="none")),  # LocalLeap without the leap
    ("cai-prophet", {}),
    ("cai", dict(cache="none")),  # cai-prophet before any exit
    ("cai-prophet", dict(cai_prophet=dict(answer_start=None))),  # never exits
    ("cai-prophet", dict(cai_prophet=dict(answer_start=0))),  # the watch on the answer's first positions
    ("prophet", dict(prophet=dict(answer_start=0))),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--task", default="synthetic:boolean_expressions")
    p.add_argument("--limit", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--block-length", type=int, default=64)
    args = p.parse_args()
    lm = caidllm.load(args.model, device="cpu", dtype="float32")
    task = load_task(args.task, limit=args.limit)
    prompts = [lm.encode_chat(s.prompt) for s in task.samples]
    print("| run | score | forwards / question |\n|---|---|---|")
    for method, options in RUNS:
        results = []
        for i in range(0, len(prompts), args.batch_size):
            batch = prompts[i : i + args.batch_size]
            results += lm.generate(
                batch, method=method, gen_length=args.gen_length, block_length=args.block_length, **options
            )
        score = sum(task.scorer(r.text, s).score for r, s in zip(results, task.samples)) / len(results)
        nfe = sum(r.nfe for r in results) / len(results)
        print(f"| `{method}` {options or ''} | {100 * score:.2f} | {nfe:.2f} |", flush=True)


if __name__ == "__main__":
    main()
