"""Tensor parallelism on a CPU (gloo): the same prompts decoded at tp 1, 2 and 4; prints, per
tp, whether the tokens equal tp 1's, the time per engine step and the share of rank 0's time
spent in the forward's all-reduces. On a CPU this checks correctness, not speed: the ranks share
the machine's cores, and gloo's all-reduce goes through local TCP.

    OMP_NUM_THREADS=1 python benchmarks/tensor_parallel.py --model tiny --tp 1 2 4
"""

from __future__ import annotations

import argparse
import time

from caidllm.decode.api import tokenize_prompts
from caidllm.decode.engine import Engine
from caidllm.decode.presets import build_config
from caidllm.parallel.launch import parallel_model

PROMPTS = [
    "What is 2 plus 3?",
    "not True and False is",
    "Tell me a story about a dog and a cat",
    "Question: 17 + 25 = ? Answer:",
]


def run(args, tp: int) -> dict:
    ns = argparse.Namespace(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        compile=False,
        quantize=None,
        quantize_head=False,
    )
    with parallel_model(ns, tp) as lm:
        config = build_config(args.method, gen_length=args.gen_length, block_length=args.block_length)
        prompts = tokenize_prompts(lm, PROMPTS, chat=False)
        for _ in range(2):  # the first pass warms up; the second is measured
            engine = Engine(lm, max_batch=len(prompts))
            ids = [engine.submit(p, config) for p in prompts]
            before = lm.tp.collective_s if tp > 1 else 0.0
            started = time.perf_counter()
            results = {e.request_id: e.result for e in engine.run() if e.finished}
            elapsed = time.perf_counter() - started
        collective = (lm.tp.collective_s - before) if tp > 1 else 0.0
        return {
            "tokens": [results[i].token_ids for i in ids],
            "steps": engine.steps,
            "step_ms": 1000 * elapsed / engine.steps,
            "collective": collective / elapsed,
        }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--method", default="fastdllm")
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--block-length", type=int, default=8)
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, rank r on cuda:r)")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    print(
        f"model {args.model}, {args.method}, {len(PROMPTS)} prompts batched, gen {args.gen_length}, "
        f"block {args.block_length}, {args.dtype}, {args.device}"
    )
    print(markdown(table(args)))


def table(args) -> list[dict]:
    """One row per tp: tokens equal the first tp's, engine steps, ms per step, share in all-reduce."""
    rows = {tp: run(args, tp) for tp in args.tp}
    first = rows[args.tp[0]]
    return [
        dict(
            tp=tp,
            tokens_equal=row["tokens"] == first["tokens"],
            steps=row["steps"],
            step_ms=round(row["step_ms"], 2),
            collective_share=round(row["collective"], 3),
        )
        for tp, row in rows.items()
    ]


def markdown(rows: list[dict]) -> str:
    lines = [
        "| tp | tokens equal tp 1 | engine steps | ms per step | share in all-reduce |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['tp']} | {'yes' if r['tokens_equal'] else 'NO'} | {r['steps']} | {r['step_ms']:.1f} | "
        f"{100 * r['collective_share']:.0f}% |"
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
