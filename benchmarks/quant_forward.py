"""CPU time of one decoding forward per weight setting (BENCHMARKS.md, quantization).

    OMP_NUM_THREADS=1 python benchmarks/quant_forward.py --out runs/quant-forward.json
    python benchmarks/quant_forward.py --threads 1,2 --batches 1,8 --repeats 5 --out ...
    OMP_NUM_THREADS=1 python benchmarks/quant_forward.py --alternate --batches 1 --repeats 7 \
        --settings fp32,bf16,int8-dynamic+head@torchao,int8-dynamic+head,int4 --out runs/quant-ab.json

The model is random:llada-8b reduced to 4 layers of width 1024 (LLaDA's 126k vocabulary kept).
One forward = a full forward of a canvas of --prompt + --gen positions returning the logits of
the first --block generated positions; by default 128 positions, the logits of all of them (as
llama.cpp's diffusion example computes them; caidllm's engine asks only for its block's). Each
setting loads the model once; the times are medians of --repeats forwards after one warm-up: the
process's CPU time (at 1 thread, the forward's time on a core of its own, whatever else runs on
the machine) and the wall time. --alternate loads every setting first and then runs one forward
of each in turn, --repeats rounds (ratios within one run on a shared machine). A setting ending
in "@torchao" runs torchao's own kernel where caidllm would repack the weights for a faster one
(models/cpu_int8.py): the "before" of that kernel; "@per-expert" keeps oneDNN's int8 kernel but
runs an MoE model's routed experts one linear at a time (each with its own per-token work), the
"before" of OnednnInt8Experts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import caidllm
from caidllm.models.modes import Full
from caidllm.models.quantize import QUANTIZATIONS, weights_mb

MODEL = "random:llada-8b?n_layers=4&d_model=1024&n_heads=8&n_kv_heads=8&mlp_hidden_size=2816"
# setting -> (model dtype, quantization, quantize the output head too)
SETTINGS = {
    "fp32": ("float32", None, False),
    "bf16": ("bfloat16", None, False),
    "int8": ("float32", "int8", False),
    "int8-dynamic": ("float32", "int8-dynamic", False),
    "int4": ("bfloat16", "int4", False),
    "int8+head": ("float32", "int8", True),
    "int8-dynamic+head": ("float32", "int8-dynamic", True),
    "int4+head": ("bfloat16", "int4", True),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help="from: " + ", ".join(SETTINGS) + " (each may end in @torchao or @per-expert)",
    )
    p.add_argument(
        "--alternate", action="store_true", help="load every setting, then alternate their forwards"
    )
    p.add_argument("--batches", default="1,8")
    p.add_argument("--threads", default="1")
    p.add_argument("--prompt", type=int, default=0)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--dtype", default=None, help="the model dtype of every setting (default: each setting's own)"
    )
    p.add_argument(
        "--load-peak",
        default=None,
        metavar="MODEL",
        help="instead: the resident memory while loading MODEL in each setting and after one forward, "
        "each in a fresh process",
    )
    p.add_argument("--peak-of", default=None, help=argparse.SUPPRESS)  # one such process
    args = p.parse_args(argv)
    if args.peak_of:
        return print_load_peak(args.load_peak, args.peak_of, args.dtype)
    if args.load_peak:
        return load_peaks(args)
    rows = alternate(args) if args.alternate else one_after_another(args)
    report = dict(
        model=MODEL,
        torch=torch.__version__,
        canvas=args.prompt + args.gen,
        block=args.block,
        repeats=args.repeats,
        alternate=args.alternate,
        rows=rows,
    )
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    return 0


def load_setting(name: str, dtype: str | None):
    """The model in setting `name` ("...@torchao": with torchao's kernels, no repacking;
    "...@per-expert": packed int8 experts run one linear at a time, as before OnednnInt8Experts)."""
    base, _, kernel = name.partition("@")
    _check_setting(name, base, kernel)
    own_dtype, quantize, head = SETTINGS[base]
    packings = {}
    if kernel == "torchao" and quantize:
        packings = dict(QUANTIZATIONS[quantize].packings)
        QUANTIZATIONS[quantize].packings.clear()
    try:
        lm = caidllm.load(
            MODEL, device="cpu", dtype=dtype or own_dtype, quantize=quantize, quantize_head=head
        )
    finally:
        if packings:
            QUANTIZATIONS[quantize].packings.update(packings)
    if kernel == "per-expert":
        from caidllm.models.moe_experts import ExpertList

        for module in lm.model.modules():
            if isinstance(getattr(module, "experts", None), ExpertList):
                module.experts = ExpertList(list(module.experts))
    return lm


KERNELS = ("torchao", "per-expert")  # what may follow a setting's "@"


def _check_setting(name: str, base: str, kernel: str) -> None:
    """SystemExit naming the problem, before loading: a misspelt kernel would time the packed model
    under the name asked for, and @per-expert on another scheme that scheme unchanged."""
    if base not in SETTINGS:
        raise SystemExit(f"{name!r}: unknown setting {base!r}; expected one of {', '.join(SETTINGS)}")
    if kernel and kernel not in KERNELS:
        raise SystemExit(
            f"{name!r}: unknown kernel {kernel!r}; expected {' or '.join('@' + k for k in KERNELS)}"
        )
    if kernel == "per-expert" and SETTINGS[base][1] != "int8-dynamic":
        raise SystemExit(
            f"{name!r}: @per-expert runs int8-dynamic's packed experts one linear at a time; "
            f"{base!r} is not int8-dynamic"
        )


def row_of(name, lm, threads, batch, cpu_ms, wall_ms) -> dict:
    quantize = lm.quantization
    return dict(
        setting=name,
        dtype=str(lm.dtype).removeprefix("torch."),
        quantize=quantize,
        head=lm.quantized_head,
        threads=threads,
        batch=batch,
        cpu_ms=round(cpu_ms, 1),
        wall_ms=round(wall_ms, 1),
        weights_mb=round(weights_mb(lm), 1),
    )


def alternate(args) -> list[dict]:
    """Every setting loaded first, then one forward of each in turn per round (one thread count)."""
    threads = int(args.threads.split(",")[0])
    torch.set_num_threads(threads)
    models = {name: load_setting(name, args.dtype) for name in args.settings.split(",")}
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        ids = canvas(next(iter(models.values())), batch, args)
        times = {name: ([], []) for name in models}
        for lm in models.values():
            forward(lm, ids, args)  # warm-up
        for _ in range(args.repeats):
            for name, lm in models.items():
                cpu, wall = timed_forward(lm, ids, args)
                times[name][0].append(cpu)
                times[name][1].append(wall)
        for name, (cpu, wall) in times.items():
            rows.append(
                row_of(
                    name,
                    models[name],
                    threads,
                    batch,
                    1000 * statistics.median(cpu),
                    1000 * statistics.median(wall),
                )
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def one_after_another(args) -> list[dict]:
    rows = []
    for name in args.settings.split(","):
        lm = load_setting(name, args.dtype)
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for batch in (int(b) for b in args.batches.split(",")):
                cpu_ms, wall_ms = forward_ms(lm, batch, args)
                rows.append(row_of(name, lm, threads, batch, cpu_ms, wall_ms))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del lm
    return rows


def load_peaks(args) -> int:
    import subprocess

    rows = []
    for name in args.settings.split(","):
        dtype = ["--dtype", args.dtype] if args.dtype else []
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--out",
                "-",
                "--load-peak",
                args.load_peak,
                "--peak-of",
                name,
                *dtype,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(model=args.load_peak, rows=rows), f, indent=2)
        f.write("\n")
    return 0


def print_load_peak(model: str, name: str, dtype: str | None = None) -> int:
    """One process: the largest resident set while loading (sampled every 5 ms: a checkpoint's
    mapped pages count once touched) and the resident set after one forward has read every weight."""
    import os
    import threading

    page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page_mb  # noqa: E731
    peak, done = [rss()], threading.Event()
    before = peak[0]

    def sample():
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    own_dtype, quantize, head = SETTINGS[name]
    lm = caidllm.load(model, device="cpu", dtype=dtype or own_dtype, quantize=quantize, quantize_head=head)
    done.set()
    sampler.join()
    peak[0] = max(peak[0], rss())
    lm.forward(torch.arange(3, 19)[None])
    print(
        json.dumps(
            dict(
                setting=name,
                weights_mb=round(weights_mb(lm), 1),
                rss_before_mb=round(before, 1),
                load_peak_rss_mb=round(peak[0], 1),
                rss_after_forward_mb=round(rss(), 1),
            )
        )
    )
    return 0


def canvas(lm, batch: int, args) -> torch.Tensor:
    vocab = len(lm.tokenizer)
    return torch.randint(
        3, vocab, (batch, args.prompt + args.gen), generator=torch.Generator().manual_seed(0)
    )


def timed_forward(lm, ids, args) -> tuple[float, float]:
    """(CPU s, wall s) of one forward. On a shared machine the process's CPU time is the forward's
    cost (at 1 thread, its time on a core of its own); wall time includes waiting for one."""
    tick, cpu_tick = time.perf_counter(), time.process_time()
    forward(lm, ids, args)
    return time.process_time() - cpu_tick, time.perf_counter() - tick


def forward(lm, ids, args):
    """One full forward of the canvas, the logits of the --block positions from --prompt on."""
    return lm.forward(ids, mode=Full(start=args.prompt, end=args.prompt + args.block))


def forward_ms(lm, batch: int, args) -> tuple[float, float]:
    """(CPU ms, wall ms) of one forward, medians of --repeats after a warm-up."""
    ids = canvas(lm, batch, args)
    forward(lm, ids, args)  # warm-up
    cpu, wall = zip(*(timed_forward(lm, ids, args) for _ in range(args.repeats)))
    return 1000 * statistics.median(cpu), 1000 * statistics.median(wall)


if __name__ == "__main__":
    sys.exit(main())
