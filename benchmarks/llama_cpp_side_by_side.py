"""caidllm's forward and llama.cpp's on the same weights, alternating, 1 thread (BENCHMARKS.md,
"Quantized CPU forwards against llama.cpp").

    OMP_NUM_THREADS=1 python benchmarks/llama_cpp_side_by_side.py --checkpoint CKPT \\
        --timer build/forward_timer \\
        --gguf F32=m-f32.gguf,BF16=m-bf16.gguf,Q8_0=m-q8_0.gguf,Q4_0=m-q4_0.gguf \\
        --settings fp32,bf16,int8-dynamic+head@torchao,int8-dynamic+head,int4 --rounds 5 \\
        --out runs/llama-cpp.json

    OMP_NUM_THREADS=1 python benchmarks/llama_cpp_side_by_side.py --agreement --checkpoint CKPT \
        --timer build/forward_timer --gguf F32=m-f32.gguf,Q4_0=m-q4_0.gguf --settings fp32,int4 \\
        --out runs/agree.json

CKPT: a checkpoint folder (LLaDA: tests/helpers/checkpoints.py; LLaDA-MoE and other `random:` shapes:
tests/helpers/random_model.py); the GGUF files converted from it (llama.cpp's convert_hf_to_gguf.py,
then benchmarks/llama_cpp/forward_timer.cpp's `quantize`, which is llama-quantize's library call).
Both engines run the same canvas: 128 positions, token i = 3 + 7919 i mod (vocabulary - 3) (the
routing of an MoE model depends on the tokens). Each round runs one caidllm forward of every setting
(the logits of all 128 positions: benchmarks/quant_forward.py), then for each GGUF one forward_timer
process: --per-round llama_decode calls of the canvas with logits at every position (what llama.cpp's
diffusion example runs per step), after a warm-up. Both sides: the process's CPU time of the forward
at 1 thread. Medians over every forward of every round.

--agreement times nothing: it loads each setting in turn (one model in memory at a time) and runs
each GGUF's forward_timer `logits`, and compares every one's logits of the canvas with the first
setting's: the positions whose top token is the same, and the largest and the root-mean-square
difference over the reference logits' standard deviation (do both engines compute the same function?).
A GGUF whose vocabulary is not config.json's vocab_size runs another canvas: --agreement names it
(run it before timing).
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

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_forward  # noqa: E402 - the settings and the loader of the forward benchmark


def llama_forwards(timer: str, gguf: str, repeats: int) -> list[float]:
    """CPU ms of each of `repeats` llama.cpp forwards (one process; the load and a warm-up not counted)."""
    done = subprocess.run([timer, "time", gguf, "128", str(repeats)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"forward_timer failed on {gguf}: {done.stderr[-2000:]}")
    return [float(line.split()[0]) for line in done.stdout.splitlines()]


POSITIONS = 128


def timer_canvas(vocab_size: int) -> torch.Tensor:
    """forward_timer.cpp's canvas: token i = 3 + 7919 i mod (vocab_size - 3), [1, POSITIONS]."""
    return (3 + torch.arange(POSITIONS) * 7919 % (vocab_size - 3))[None]


def llama_logits(timer: str, gguf: str, out: Path) -> torch.Tensor:
    """The logits [POSITIONS, vocab] of one llama.cpp forward of the canvas."""
    done = subprocess.run([timer, "logits", gguf, str(POSITIONS), str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"forward_timer logits failed on {gguf}: {done.stderr[-2000:]}")
    n, vocab = map(int, done.stdout.split())
    return torch.from_numpy(np.fromfile(out, dtype=np.float32).reshape(n, vocab))


def compared(engine: str, setting: str, logits: torch.Tensor, reference: torch.Tensor) -> dict:
    """How close `logits` [positions, vocab] are to the reference's."""
    logits, reference = logits.float(), reference.float()
    scale = reference.std().item()
    diff = logits - reference
    return dict(
        engine=engine,
        setting=setting,
        same_top_token=int((logits.argmax(-1) == reference.argmax(-1)).sum()),
        positions=reference.shape[0],
        max_diff_over_std=round(diff.abs().max().item() / scale, 5),
        rms_diff_over_std=round(diff.pow(2).mean().sqrt().item() / scale, 5),
    )


def agreement(args, ggufs: dict) -> list[dict]:
    """Every setting's and GGUF's logits of the canvas against the first setting's (one model at a time)."""
    import tempfile

    timing = argparse.Namespace(prompt=0, block=POSITIONS)
    rows, reference = [], None
    for name in args.settings.split(","):
        lm = quant_forward.load_setting(name, None)
        with torch.no_grad():
            logits = quant_forward.forward(lm, timer_canvas(lm.config.vocab_size), timing)[0].float()
        del lm
        if reference is None:
            reference, first = logits, name
        rows.append(compared("caidllm", name, logits, reference))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in ggufs.items():
            logits = llama_logits(args.timer, path, Path(tmp) / "logits.bin")
            if logits.shape != reference.shape:  # its canvas is drawn from its own vocabulary size
                raise SystemExit(
                    f"{name}: llama.cpp's logits are {list(logits.shape)}, caidllm's "
                    f"{list(reference.shape)}: the GGUF's vocabulary is not config.json's "
                    "vocab_size, so the two engines ran different canvases"
                )
            rows.append(compared("llama.cpp", name, logits, reference))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return [dict(row, reference=f"caidllm {first}") for row in rows]


def timed(args, ggufs: dict) -> list[dict]:
    """Every setting loaded, then alternating rounds of caidllm's forwards and llama.cpp's."""
    models = {name: quant_forward.load_setting(name, None) for name in args.settings.split(",")}
    ids = timer_canvas(next(iter(models.values())).config.vocab_size)
    timing = argparse.Namespace(prompt=0, block=POSITIONS)
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
    rows = [
        dict(
            engine="caidllm",
            setting=name,
            forward_cpu_ms=round(statistics.median(t), 1),
            weights_mb=round(quant_forward.weights_mb(models[name]), 1),
        )
        for name, t in ours.items()
    ]
    rows += [
        dict(
            engine="llama.cpp",
            setting=name,
            forward_cpu_ms=round(statistics.median(t), 1),
            file_mb=round(os.path.getsize(ggufs[name]) / 2**20, 1),
        )
        for name, t in theirs.items()
    ]
    for row in rows:
        print(json.dumps(row), file=sys.stderr)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--timer", required=True, help="forward_timer built against libllama")
    p.add_argument("--gguf", required=True, help="NAME=FILE,... (llama.cpp's weights of the same checkpoint)")
    p.add_argument("--settings", default="fp32,bf16,int8-dynamic+head,int4")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per-round", type=int, default=2, help="llama.cpp forwards per GGUF per round")
    p.add_argument(
        "--agreement",
        action="store_true",
        help="instead of timing: each setting's and GGUF's logits against the first setting's",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ggufs = dict(item.split("=", 1) for item in args.gguf.split(","))
    quant_forward.MODEL = args.checkpoint
    rows = agreement(args, ggufs) if args.agreement else timed(args, ggufs)
    with open(args.out, "w") as f:
        json.dump(
            dict(
                checkpoint=args.checkpoint,
                torch=torch.__version__,
                rounds=args.rounds,
                canvas=POSITIONS,
                threads=1,
                agreement=args.agreement,
                rows=rows,
            ),
            f,
            indent=2,
        )
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
