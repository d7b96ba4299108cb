"""caidllm's forward and llama.cpp's on the same weights, alternating, 1 thread (BENCHMARKS.md,
"Quantized CPU forwards against llama.cpp").

    OMP_NUM_THREADS=1 python benchmarks/llama_cpp_side_by_side.py --checkpoint CKPT \\
        --timer build/forward_timer --gguf F32=m-f32.gguf,BF16=m-bf16.gguf,Q8_0=m-q8_0.gguf,Q4_0=m-q4_0.gguf \\
        --settings fp32,bf16,int8-dynamic+head@torchao,int8-dynamic+head,int4 --rounds 5 --out runs/llama-cpp.json

CKPT: a LLaDA checkpoint folder (tests/helpers/checkpoints.py); the GGUF files converted from it
(llama.cpp's convert_hf_to_gguf.py, then benchmarks/llama_cpp/forward_timer.cpp's `quantize`, which
is llama-quantize's library call). Each round runs one caidllm forward of every setting (a
128-position canvas, the logits of all 128: benchmarks/quant_forward.py), then for each GGUF one
forward_timer process: --per-round llama_decode calls of a 128-position canvas with logits at every
position (what llama.cpp's diffusion example runs per step), after a warm-up. Both sides: the
process's CPU time of the forward at 1 thread. Medians over every forward of every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_forward  # noqa: E402 - the settings and the loader of the forward benchmark

def llama_forwards(timer: str, gguf: str, repeats: int) -> list[float]:
    """CPU ms of each of `repeats` llama.cpp forwards (one process; the load and a warm-up not counted)."""
    done = subprocess.run([timer, "time", gguf, "128", str(repeats)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"forward_timer failed on {gguf}: {done.stderr[-2000:]}")
    return [float(line.split()[0]) for line in done.stdout.splitlines()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--timer", required=True, help="forward_timer built against libllama")
    p.add_argument("--gguf", required=True, help="NAME=FILE,... (llama.cpp's weights of the same checkpoint)")
    p.add_argument("--settings", default="fp32,bf16,int8-dynamic+head,int4")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=2, help="llama.cpp forwards per GGUF per round")
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
        quant_forward.forward(lm, ids, timing)  # warm-up
    ours = {name: [] for name in models}
    theirs = {name: [] for name in ggufs}
    for round_ in range(args.rounds):
        for name, lm in models.items():
            ours[name].append(1000 * quant_forward.timed_forward(lm, ids, timing)[0])
        for name, path in ggufs.items():
            theirs[name] += llama_forwards(args.timer, path, args.per_round)
        print(f"{time.strftime('%H:%M:%S')} round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
    rows = [dict(engine="caidllm", setting=name, forward_cpu_ms=round(statistics.median(t), 1),
                 weights_mb=round(quant_forward.weights_mb(models[name]), 1)) for name, t in ours.items()]
    rows += [dict(engine="llama.cpp", setting=name, forward_cpu_ms=round(statistics.median(t), 1),
                  file_mb=round(os.path.getsize(ggufs[name]) / 2**20, 1)) for name, t in theirs.items()]
    for row in rows:
        print(json.dumps(row), file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(dict(checkpoint=args.checkpoint, torch=torch.__version__, rounds=args.rounds, canvas=128,
                       threads=1, rows=rows), f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
