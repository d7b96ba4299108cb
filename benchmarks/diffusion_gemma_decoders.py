"""The uniform-state decoders side by side on one DiffusionGemma model and one benchmark task: forwards
per canvas, tokens per forward, wall time and accuracy of `diffusiongemma`, `greedy` and
`diffusiongemma-cai` (each on the same prompts, one warm-up prompt first). Tasks are the bench's
(`--task bbh:boolean_expressions` reads --data-dir, else the folder bench/datadir.py finds;
`synthetic:<name>` needs none). The default model is a small random DiffusionGemma (its answers are
noise: it measures the decoders' cost, not their accuracy).

    python benchmarks/diffusion_gemma_decoders.py --task synthetic:boolean_expressions --limit 4
    python benchmarks/diffusion_gemma_decoders.py --model src/caidllm/assets/tiny-dg \\
        --task bbh:boolean_expressions --limit 50 --dgcai entropy_end=1.0 --dgcai gating=false \\
        --set max_denoising_steps=32
"""

from __future__ import annotations

import argparse
import json
import time

import torch

SMALL = (
    "random:diffusiongemma-26b-a4b?num_hidden_layers=2&hidden_size=64&intermediate_size=64"
    "&moe_intermediate_size=32&num_experts=8&top_k_experts=2&num_attention_heads=8&head_dim=16"
    "&global_head_dim=32&vocab_size=4096"
)
METHODS = ("diffusiongemma", "greedy", "diffusiongemma-cai")


def _value(text: str):
    """A --dgcai / --set value: true / false, an integer, a number, or a comma-separated tuple of numbers."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    numbers = [int(x) if x.lstrip("-").isdigit() else float(x) for x in text.split(",")]
    return tuple(numbers) if len(numbers) > 1 else numbers[0]


def run_method(lm, task, method: str, args) -> dict:
    dgcai = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.dgcai)}
    shared = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    options = dict(method=method, gen_length=args.gen_length, seed=args.seed, batch_size=args.batch_size)
    options.update(shared)
    if method == "diffusiongemma-cai" and dgcai:
        options["dgcai"] = dgcai
    prompts = [s.render() for s in task.samples]
    lm.generate(prompts[:1], **options)  # warm-up
    started = time.perf_counter()
    results = lm.generate(prompts, **options)
    wall = time.perf_counter() - started
    canvases = sum(len(r.steps_per_block) for r in results)
    forwards = sum(r.nfe for r in results)
    correct = sum(task.score(r.text, s).correct for r, s in zip(results, task.samples))
    return {
        "method": method,
        "prompts": len(results),
        "accuracy": round(correct / len(results), 4),
        "forwards_per_canvas": round(forwards / canvases, 2),
        "tokens_per_forward": round(sum(r.answer_length for r in results) / forwards, 3),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    from caidllm.bench.datadir import default_data_dir
    from caidllm.bench.tasks import load_task, reads_data_folder
    from caidllm.models import load

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=SMALL)
    p.add_argument("--task", default="synthetic:boolean_expressions")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--dgcai", action="append", default=[], help="a diffusiongemma-cai setting, key=value")
    p.add_argument("--set", action="append", default=[], help="a setting of every decoder (t_max=0.6)")
    p.add_argument("--data-dir", default=None, help="the bench's data folder (default: bench/datadir.py's)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = args.data_dir or (default_data_dir() if reads_data_folder(args.task) else None)
    task = load_task(args.task, data_dir=data_dir, limit=args.limit)
    lm = load(args.model, device="cpu", dtype="float32")
    for method in args.methods.split(","):
        row = run_method(lm, task, method.strip(), args)
        print(json.dumps({"model": args.model.split("?")[0], "task": args.task, **row}))


if __name__ == "__main__":
    main()
