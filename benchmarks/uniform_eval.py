"""Accuracy of a model on benchmark tasks through the Python API, scored by `caidllm bench`'s own task
scorers: for the uniform-state family (DiffusionGemma, tiny-dg), which `caidllm bench` does not run yet, and
for a mask-based model beside it with the same prompts and scorer.

    python benchmarks/uniform_eval.py --model tiny-dg --methods diffusiongemma,greedy \
        --task bbh:boolean_expressions --task bbh:web_of_lies --data-dir /work/shared/data --out runs/dg.json

Per task and method: accuracy +- its standard error, forwards per canvas (uniform) or per answer (mask-based),
wall time. A prompt is the task's user message under the model's chat template (as the bench does).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import caidllm
from caidllm.bench.datadir import default_data_dir
from caidllm.bench.tasks import load_task
from caidllm.models.families import get_family


def evaluate(lm, task, method: str, gen_length: int, batch_size: int, options: dict) -> dict:
    """One task with one method, `batch_size` prompts at a time (a running line per batch on stderr)."""
    samples, scores, forwards, canvases = task.samples, [], 0, 0
    started = time.perf_counter()
    for at in range(0, len(samples), batch_size):
        chunk = samples[at : at + batch_size]
        results = lm.generate([s.render() for s in chunk], method=method, gen_length=gen_length, **options)
        scores += [task.scorer(r.text, s).score for r, s in zip(results, chunk)]
        forwards += sum(r.nfe for r in results)
        canvases += sum(len(r.steps_per_block) for r in results)
        print(
            f"{task.name} {method}: {sum(scores):g}/{len(scores)} right, {forwards} forwards, "
            f"{canvases} canvases, {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    wall = time.perf_counter() - started
    n, mean = len(scores), sum(scores) / len(scores)
    stderr = math.sqrt(mean * (1 - mean) / (n - 1)) if n > 1 else 0.0
    return {
        "task": task.name,
        "method": method,
        "n": n,
        "accuracy": round(100 * mean, 2),
        "stderr": round(100 * stderr, 2),
        "forwards": forwards,
        "forwards_per_answer": round(forwards / n, 2),
        "forwards_per_block": round(forwards / max(1, canvases), 2),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-dg")
    parser.add_argument("--methods", default="diffusiongemma,greedy")
    parser.add_argument("--task", action="append", help="a `caidllm bench` task spec (repeatable)")
    parser.add_argument("--data-dir", help="the benchmark data folder (default: as `caidllm bench` finds it)")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument(
        "--skip", type=int, default=0, help="leave out the first SKIP examples (to shard a task)"
    )
    parser.add_argument("--gen-length", type=int, default=192)
    parser.add_argument("--block-length", type=int, default=32, help="mask-based methods only")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0, help="uniform-state methods only")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    lm = caidllm.load(args.model, device="cpu")
    uniform = get_family(lm.config.family).uniform
    options = {"seed": args.seed} if uniform else {"block_length": args.block_length}
    options["batch_size"] = args.batch_size
    rows = []
    for spec in args.task or ["bbh:boolean_expressions", "bbh:web_of_lies"]:
        task = load_task(
            spec, data_dir=Path(args.data_dir) if args.data_dir else default_data_dir(), limit=args.limit
        )
        task.samples = task.samples[args.skip :]
        for method in args.methods.split(","):
            rows.append(evaluate(lm, task, method, args.gen_length, args.batch_size, options))
            print(json.dumps({"model": args.model, **rows[-1]}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "gen_length": args.gen_length, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
