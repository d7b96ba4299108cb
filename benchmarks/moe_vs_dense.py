"""What the loop over experts costs: the MoE feed-forward of random:llada2-mini (256 experts,
top-8 plus one shared, expert width 512, hidden 2048; models/moe.py) against a dense SwiGLU
of the same active size (width 9 x 512 = 4608: the same multiply-adds per token), on the
same tokens, one forward at a time.

    OMP_NUM_THREADS=1 python benchmarks/moe_vs_dense.py            # CPU, fp32
    python benchmarks/moe_vs_dense.py --device cuda --dtype bfloat16

Prints a Markdown table: tokens per forward, tokens/s of each, and dense / MoE (how many
times faster the dense layer is). Also the MoE's split between routing and the experts.
"""

from __future__ import annotations

import argparse
import time

import torch

import caidllm
from caidllm.models.moe import ExpertMLP
from caidllm.models.random_init import initialise


def timed(fn, device, repeats: int) -> float:
    """Median seconds of fn() over `repeats` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        tick = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - tick)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tokens", default="4,32,128,512", help="tokens per forward (a block, several rows' blocks)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    # Two layers of LLaDA2.0-mini: layer 0 is dense, layer 1 an MoE layer of the official shape.
    lm = caidllm.load("random:llada2-mini?num_hidden_layers=2", device=device, dtype=args.dtype)
    moe = lm.model.model.layers[1].mlp
    cfg = moe.config
    dense = ExpertMLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.active_experts).to(device, lm.dtype)
    initialise(dense, torch.Generator(device=device).manual_seed(1))
    g = torch.Generator(device=device).manual_seed(0)
    print(f"MoE: {cfg.num_experts} experts, top-{cfg.num_experts_per_tok} + {cfg.num_shared_experts} shared, "
          f"width {cfg.moe_intermediate_size}; dense: width {cfg.moe_intermediate_size * cfg.active_experts}; "
          f"{device}, {lm.dtype}, torch threads {torch.get_num_threads()}\n")
    print("| Tokens / forward | MoE tokens/s | Dense tokens/s | Dense / MoE | MoE: routing share |")
    print("|---|---|---|---|---|")
    with torch.no_grad():
        for n in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(1, n, cfg.hidden_size, device=device, generator=g).to(lm.dtype)
            t_moe = timed(lambda: moe(x), device, args.repeats)
            t_dense = timed(lambda: dense(x), device, args.repeats)
            t_route = timed(lambda: moe.gate(x.view(-1, cfg.hidden_size)), device, args.repeats)
            print(f"| {n} | {n / t_moe:,.0f} | {n / t_dense:,.0f} | {t_moe / t_dense:.1f}x | "
                  f"{100 * t_route / t_moe:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
