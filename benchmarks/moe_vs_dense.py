"""What the experts cost: the MoE feed-forward of random:llada2-mini (256 experts, top-8 plus
one shared, expert width 512, hidden 2048; models/moe.py) run by the per-expert loop (the
reference), the grouped kernel and ``auto`` (the default; models/moe_kernels.py; add sized and
native, the compiled CPU kernel, with --kernels), against a dense
SwiGLU of the same active size (width 9 x 512 = 4608: the same multiply-adds per token) and
against the read bound: the time to read, once, the weights of the experts the tokens chose
(plus the shared expert and the router), at the read bandwidth measured among them in the same rounds. Then
the whole forward of random:llada2-mini and random:llada-moe-7b reduced to 4 layers, each kernel.
The kernels run alternately within one run (A/B), so a shared machine's load falls on all, and
the clock is by default this thread's CPU time (one thread does all the work), which other
processes taking the core do not inflate (their use of the memory bus still does).

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/moe_vs_dense.py         # CPU, fp32 and bf16
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/moe_vs_dense.py \\
        --kernels loop,grouped,sized,native,auto
    python benchmarks/moe_vs_dense.py --device cuda --dtypes bfloat16 --kernels loop,grouped,padded

Prints Markdown tables. A whole-model row the machine has not the memory for is skipped, and says so.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

import caidllm
from caidllm.models.moe import MoEFeedForward, set_moe_kernel
from caidllm.models.moe_experts import ExpertMLP
from caidllm.models.random_init import initialise

MODELS = ("random:llada2-mini?num_hidden_layers=4", "random:llada-moe-7b?num_hidden_layers=4")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# "thread": this thread's CPU time (one torch thread: all the work), which a shared machine's
# other processes do not inflate by taking the core away; "wall": elapsed time (always on a GPU).
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}
clock = CLOCKS["thread"]


def timed_ab(fns: dict, device, repeats: int) -> dict:
    """Median seconds of each fn over `repeats` rounds, the fns alternating within each round."""
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            tick = clock()
            fn()
            sync(device)
            times[name].append(clock() - tick)
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


class ReadProbe:
    """A matrix-vector product over a buffer far larger than the caches (the way one token reads
    a weight matrix): bytes read per second. Timed among the kernels in every round, so the
    bound follows the memory bus's load from other processes as the run goes."""

    def __init__(self, device, gib: float = 0.5):
        self.matrix = torch.ones(8192, int(gib * 2**30) // (4 * 8192), device=device)
        self.vector = torch.ones(self.matrix.shape[1], device=device)

    def __call__(self):
        return self.matrix @ self.vector

    def bandwidth(self, seconds: float) -> float:
        return self.matrix.numel() * 4 / seconds


def build_layers(device, dtype):
    """LLaDA2.0-mini's MoE layer (official shape, random weights) and the dense layer of its active size."""
    shape = caidllm.load("random:llada2-mini?num_hidden_layers=2", device="meta")
    cfg = shape.config.moe
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.device("meta"):
        moe = MoEFeedForward(cfg)
        dense = ExpertMLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.active_experts)
    layers = []
    for module in (moe, dense):
        module.to_empty(device=device)
        initialise(module, generator)
        layers.append(module.to(dtype).eval())
    return layers


def read_bound(moe: MoEFeedForward, x: torch.Tensor, bandwidth: float) -> float:
    """Seconds to read once the weights one forward of x needs: the chosen experts, shared one, router."""
    cfg = moe.config
    chosen, _ = moe.gate(x)
    distinct = int(torch.unique(chosen).numel())
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    params = (distinct + cfg.num_shared_experts) * per_expert + cfg.num_experts * cfg.hidden_size
    return params * x.element_size() / bandwidth


def ratios_header(kernels) -> str:
    """The last kernel ('after') against each earlier one."""
    return " | ".join(f"{kernels[-1]} / {k}" for k in kernels[:-1])


def ratios(t: dict, kernels) -> str:
    return " | ".join(f"{t[kernels[-1]] / t[k]:.2f}x" for k in kernels[:-1])


def layer_table(device, dtypes, token_counts, kernels, repeats, probe: ReadProbe) -> None:
    after = kernels[-1]
    print(
        f"\n| dtype | Tokens | {' | '.join(f'{k} ms' for k in kernels)} | Dense ms | GB/s | Read bound ms | "
        f"{ratios_header(kernels)} | {after} / max(dense, bound) | MoE / dense tokens/s ({after}) |"
    )
    print("|---|---|" + "---|" * (2 * len(kernels) + 4))
    for dtype in dtypes:
        moe, dense = build_layers(device, dtype)
        g = torch.Generator(device=device).manual_seed(1)
        with torch.no_grad():
            for n in token_counts:
                x = torch.randn(n, moe.config.hidden_size, device=device, generator=g).to(dtype)
                t = timed_ab(layer_calls(moe, dense, x, kernels, probe), device, repeats)
                bandwidth = probe.bandwidth(t["read"])
                bound = read_bound(moe, x, bandwidth)
                cells = " | ".join(f"{1e3 * t[k]:.1f}" for k in kernels)
                print(
                    f"| {str(dtype).removeprefix('torch.')} | {n} | {cells} | {1e3 * t['dense']:.1f} | "
                    f"{bandwidth / 1e9:.1f} | {1e3 * bound:.1f} | {ratios(t, kernels)} | "
                    f"{t[after] / max(t['dense'], bound):.2f}x | {t['dense'] / t[after]:.2f}x |",
                    flush=True,
                )
        del moe, dense
        gc.collect()


def layer_calls(moe, dense, x, kernels, probe: ReadProbe) -> dict:
    """The timed calls of one row: each MoE kernel, the dense layer, the read probe (built here, so that
    the layers' later `del` in the caller does not reach into these closures)."""
    calls = {k: (lambda k=k: run_kernel(moe, k, x)) for k in kernels}
    calls["dense"] = lambda: dense(x)
    calls["read"] = probe
    return calls


def model_calls(lm, ids, kernels) -> dict:
    """One full-model forward per kernel (the model's MoE layers set to that kernel first)."""
    return {k: (lambda k=k: (set_moe_kernel(lm.model, k), lm.logits(ids))) for k in kernels}


def run_kernel(moe: MoEFeedForward, kernel: str, x: torch.Tensor):
    moe.kernel = kernel
    return moe(x)


def available_bytes(device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024


def model_table(device, dtypes, models, tokens, kernels, repeats) -> None:
    print(
        f"\n| Model (4 layers) | dtype | Tokens | {' | '.join(f'{k} ms' for k in kernels)} | "
        f"{ratios_header(kernels)} |"
    )
    print("|---|---|---|" + "---|" * (2 * len(kernels) - 1))
    for name in models:
        for dtype in dtypes:
            meta = caidllm.load(name, device="meta")
            need = sum(p.numel() for p in meta.model.parameters()) * dtype.itemsize
            label = f"| {name.removeprefix('random:')} | {str(dtype).removeprefix('torch.')} | {tokens} |"
            if need * 1.15 > available_bytes(device):
                print(
                    f"{label} skipped: its weights need {need / 2**30:.1f} GiB, "
                    f"{available_bytes(device) / 2**30:.1f} GiB available |",
                    flush=True,
                )
                continue
            lm = caidllm.load(name, device=device, dtype=dtype)
            ids = torch.randint(0, 1000, (1, tokens), device=device)
            with torch.no_grad():
                t = timed_ab(model_calls(lm, ids, kernels), device, repeats)
            cells = " | ".join(f"{1e3 * t[k]:.0f}" for k in kernels)
            print(f"{label} {cells} | {ratios(t, kernels)} |", flush=True)
            del lm
            gc.collect()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument(
        "--tokens", default="4,32,128,512", help="tokens per forward (a block, several rows' blocks)"
    )
    p.add_argument(
        "--kernels",
        default="loop,grouped,auto",
        help="the last is 'after', set against each of the others (loop: the reference)",
    )
    p.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="thread",
        help="thread: this thread's CPU time (default: fair on a shared machine, one thread); wall",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", default=",".join(MODELS), help="whole forwards to time ('' for none)")
    p.add_argument("--model-tokens", type=int, default=128, help="positions per whole forward")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    kernels = args.kernels.split(",")
    global clock
    clock = CLOCKS["wall" if device.type == "cuda" else args.clock]
    print(
        f"{device}, torch threads {torch.get_num_threads()}, clock {clock.__name__}; read bandwidth: a "
        "matrix-vector "
        "product over 0.5 GiB, timed among the kernels in each round (GB/s column); "
        "MoE: LLaDA2.0-mini's layer (256 experts, top-8 + 1 shared, width 512); dense: width 4608"
    )
    layer_table(
        device, dtypes, [int(t) for t in args.tokens.split(",")], kernels, args.repeats, ReadProbe(device)
    )
    models = [m for m in args.models.split(",") if m]
    if models:
        model_table(device, dtypes, models, args.model_tokens, kernels, max(2, args.repeats // 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
