"""caidllm's forward and llama.cpp's diffusion example on the same weights, alternating, 1 thread
(BENCHMARKS.md, "Quantized CPU forwards against llama.cpp").

    OMP_NUM_THREADS=1 python benchmarks/llama_cpp_side_by_side.py --checkpoint CKPT \\
        --cli LLAMA/build/bin/llama-diffusion-cli --gguf F32=m-f32.gguf,BF16=m-bf16.gguf,Q8_0=m-q8_0.gguf,Q4_0=m-q4_0.gguf \\
        --settings fp32,bf16,int8-dynamic+head@torchao,int8-dynamic+head,int4 --rounds 5 --out runs/llama-cpp.json

CKPT: a LLaDA checkpoint folder (tests/helpers/checkpoints.py), the GGUF files converted from it
(llama.cpp's convert_hf_to_gguf.py, then llama-quantize). Each round runs one caidllm forward of
every setting (a 128-position canvas, all logits: benchmarks/quant_forward.py) and then, for each
GGUF, llama-diffusion-cli at 1 thread on a 128-position canvas (-ub 128) for --short and --long
diffusion steps. llama.cpp's forward per step, as CPU time: (CPU(long) - CPU(short)) / (long - short)
(the load cancels), times the share of a step that is not sampling (its own printed "time per step"
and "sampling time per step"). caidllm: the process's CPU time of one forward. Medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_forward  # noqa: E402 - the settings and the loader of the forward benchmark

STEP = re.compile(r"time per step: ([\d.]+)ms, sampling time per step: ([\d.]+)ms")


def llama_run(cli: str, gguf: str, steps: int) -> tuple[float, float, float]:
    """(CPU s of the whole process, wall ms per step, sampling ms per step) of one diffusion run."""
    argv = [cli, "-m", gguf, "-p", "hello", "-t", "1", "-tb", "1", "-ub", "128", "-b", "128", "-c", "128",
            "--diffusion-steps", str(steps), "--diffusion-eps", "0.001", "--temp", "0", "--seed", "0", "-ngl", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    found = STEP.search(output)
    if status != 0 or found is None:
        raise SystemExit(f"llama-diffusion-cli failed on {gguf} (status {status}):\n{output[-2000:]}")
    return usage.ru_utime + usage.ru_stime, float(found.group(1)), float(found.group(2))


def llama_forward_ms(cli: str, gguf: str, short: int, long: int) -> dict:
    cpu_short, _, _ = llama_run(cli, gguf, short)
    cpu_long, step_ms, sampling_ms = llama_run(cli, gguf, long)
    step_cpu_ms = 1000 * (cpu_long - cpu_short) / (long - short)
    return dict(step_cpu_ms=step_cpu_ms, forward_cpu_ms=step_cpu_ms * (1 - sampling_ms / step_ms),
                step_wall_ms=step_ms, sampling_wall_ms=sampling_ms)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--cli", required=True, help="llama-diffusion-cli")
    p.add_argument("--gguf", required=True, help="NAME=FILE,... (llama.cpp's weights of the same checkpoint)")
    p.add_argument("--settings", default="fp32,bf16,int8-dynamic+head,int4")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--short", type=int, default=2)
    p.add_argument("--long", type=int, default=8)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ggufs = dict(item.split("=", 1) for item in args.gguf.split(","))
    quant_forward.MODEL = args.checkpoint
    models = {name: quant_forward.load_setting(name, None) for name in args.settings.split(",")}
    ids = torch.randint(3, len(next(iter(models.values())).tokenizer), (1, 128),
                        generator=torch.Generator().manual_seed(0))
    timing = argparse.Namespace(prompt=0, block=128)
    for lm in models.values():
        lm.forward(ids, start=0, end=128)  # warm-up
    ours = {name: [] for name in models}
    theirs = {name: [] for name in ggufs}
    for round_ in range(args.rounds):
        for name, lm in models.items():
            ours[name].append(1000 * quant_forward.timed_forward(lm, ids, timing)[0])
        for name, path in ggufs.items():
            theirs[name].append(llama_forward_ms(args.cli, path, args.short, args.long))
        print(f"{time.strftime('%H:%M:%S')} round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
    rows = [dict(engine="caidllm", setting=name, forward_cpu_ms=round(statistics.median(t), 1),
                 weights_mb=round(quant_forward.weights_mb(models[name]), 1)) for name, t in ours.items()]
    rows += [dict(engine="llama.cpp", setting=name, file_mb=round(os.path.getsize(ggufs[name]) / 2**20, 1),
                  **{key: round(statistics.median(r[key] for r in runs), 1) for key in runs[0]})
             for name, runs in theirs.items()]
    for row in rows:
        print(json.dumps(row), file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(dict(checkpoint=args.checkpoint, torch=torch.__version__, rounds=args.rounds, canvas=128,
                       threads=1, rows=rows), f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
