"""Accuracy of a block-diffusion model on real BBH files with the plain block decoder
of caidllm/train/bd_decode.py (vanilla: one token per step, low confidence first).

    python training/bd_eval.py --model tiny-bd --data-dir ../shared/data \\
        --task boolean_expressions --task web_of_lies --block-length 8 --block-length 32

Prints one JSON line per (task, block length): n, accuracy, its standard error, seconds;
with --expert-load (an MoE model: tiny-moe), also each MoE layer's share of the routed
(token, choice) pairs per expert during that decoding (train/moe_balance.py).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

import caidllm
from caidllm.bench.tasks.bbh import load
from caidllm.train.bd_decode import block_diffusion_generate
from caidllm.train.moe_balance import ExpertCounter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-bd")
    parser.add_argument("--data-dir", required=True, help="folder holding bbh/<task>.json")
    parser.add_argument("--task", action="append", required=True)
    parser.add_argument("--block-length", type=int, action="append", required=True)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--expert-load", action="store_true", help="also report the load per expert (MoE models)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm = caidllm.load(args.model)
    for name in args.task:
        task = load(Path(args.data_dir), name, args.limit, 0)
        prompts = [sample.prompt for sample in task.samples]
        for block_length in args.block_length:
            tick = time.time()
            counter = ExpertCounter(lm.model) if args.expert_load else None
            texts = block_diffusion_generate(lm, prompts, block_length, args.gen_length, args.batch_size)
            expert_load = (
                {}
                if counter is None
                else {"expert_load": [[round(s, 4) for s in layer] for layer in counter.shares()]}
            )
            if counter is not None:
                counter.detach()
            scores = [task.score(text, sample).score for text, sample in zip(texts, task.samples)]
            accuracy = sum(scores) / len(scores)
            stderr = math.sqrt(accuracy * (1 - accuracy) / max(1, len(scores) - 1))
            print(
                json.dumps(
                    {
                        "model": args.model,
                        "task": name,
                        "block_length": block_length,
                        "n": len(scores),
                        "accuracy": round(accuracy, 4),
                        "stderr": round(stderr, 4),
                        "seconds": round(time.time() - tick, 1),
                        **expert_load,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
