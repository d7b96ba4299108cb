"""Where a quantized CPU forward spends its time (BENCHMARKS.md, "The same side by side on the
LLaDA-MoE shape"): one projection alone per weight kind, and the top operators of one forward.

    OMP_NUM_THREADS=1 python benchmarks/quant_parts.py --checkpoint CKPT --linears --rows 16,128
    OMP_NUM_THREADS=1 python benchmarks/quant_parts.py --checkpoint CKPT --profile int4,int8-dynamic+head

--linears times one linear of each projection shape of the checkpoint's layers (the experts'
[intermediate, hidden] and [hidden, intermediate], attention's [hidden, hidden]) at each row count,
random weights: bf16 F.linear and weight @ rows.T, torchao int4 (F.linear on its tensor), and
int8-dynamic through oneDNN (the whole linear, its matmul alone, its per-token quantization
alone). The same weight every call, so it sits in the cache: a forward, which reads every
expert's weights once, is slower where the weights do not fit. --profile loads each setting of
benchmarks/quant_forward.py in turn and prints the median CPU ms of --repeats forwards of the
128-position canvas (llama_cpp_side_by_side.py's) and torch.profiler's table of one forward.
CPU time of this process, 1 thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_side_by_side  # noqa: E402 - the canvas both engines run
import quant_forward  # noqa: E402 - the settings and their loader

from caidllm.models.quantize import QUANTIZATIONS, quantize_module  # noqa: E402


def cpu_ms(fn, repeats: int) -> float:
    """Median CPU ms of fn() over `repeats` calls, after one."""
    fn()
    times = []
    for _ in range(repeats):
        tick = time.process_time()
        fn()
        times.append(1000 * (time.process_time() - tick))
    return statistics.median(times)


def linear_rows(out_features: int, in_features: int, rows: int, repeats: int) -> dict:
    """One [out, in] projection at `rows` rows, each kind of weight."""
    from caidllm.models.cpu_int8 import _matmul, quantize_per_token

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    x = torch.randn(rows, in_features, dtype=torch.bfloat16)
    int4 = nn.Sequential(nn.Linear(in_features, out_features, bias=False)).to(torch.bfloat16)
    w_bf16 = int4[0].weight.detach().clone()
    quantize_module(int4, QUANTIZATIONS["int4"], cpu)
    int8 = nn.Sequential(nn.Linear(in_features, out_features, bias=False))
    quantize_module(int8, QUANTIZATIONS["int8-dynamic"], cpu)
    w8, xf = int8[0].weight, x.float()
    values, _ = quantize_per_token(xf)
    kinds = {
        "bf16 F.linear": lambda: F.linear(x, w_bf16),
        "bf16 weight @ rows.T": lambda: torch.mm(w_bf16, x.t()),
        "int4 F.linear": lambda: F.linear(x, int4[0].weight),
    }
    if hasattr(w8, "packed"):  # oneDNN's packing (cpu_int8.py) where this torch has it
        kinds.update(
            {
                "int8-dynamic F.linear": lambda: F.linear(xf, w8),
                "int8 matmul alone": lambda: _matmul(values, w8.packed, w8.scale, torch.float32),
                "int8 per-token quantization alone": lambda: quantize_per_token(xf),
            }
        )
    with torch.no_grad():
        ms = {name: round(cpu_ms(fn, repeats), 3) for name, fn in kinds.items()}
    return dict(out_features=out_features, in_features=in_features, rows=rows, cpu_ms=ms)


def shapes_of(checkpoint: str) -> list[tuple[int, int]]:
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    hidden = config.get("hidden_size") or config["d_model"]
    # an expert's width (LLaDA-MoE's field, LLaDA2's and SDAR-MoE's), else the dense MLP's
    inter = (
        config.get("expert_intermediate_size")
        or config.get("moe_intermediate_size")
        or config.get("intermediate_size")
        or config["mlp_hidden_size"]
    )
    return [(inter, hidden), (hidden, inter), (hidden, hidden)]


def profile(setting: str, repeats: int, top: int) -> dict:
    """The setting's forward time and the top operators of one forward (printed)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    lm = quant_forward.load_setting(setting, None)
    ids = llama_cpp_side_by_side.timer_canvas(lm.config.vocab_size)
    timing = argparse.Namespace(prompt=0, block=ids.shape[1])
    forward_ms = cpu_ms(lambda: quant_forward.forward(lm, ids, timing), repeats)
    with profiler(activities=[ProfilerActivity.CPU]) as prof:
        quant_forward.forward(lm, ids, timing)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    print(f"== {setting}: forward {forward_ms:.1f} ms", file=sys.stderr)
    print(
        prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top), file=sys.stderr, flush=True
    )
    return dict(
        setting=setting,
        forward_cpu_ms=round(forward_ms, 1),
        top=[
            dict(op=e.key, calls=e.count, self_cpu_ms=round(e.self_cpu_time_total / 1000, 1)) for e in events
        ],
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--linears", action="store_true", help="time one projection of each shape alone")
    p.add_argument("--rows", default="16,128")
    p.add_argument(
        "--profile", default="", help="settings of benchmarks/quant_forward.py to profile a forward of"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    quant_forward.MODEL = args.checkpoint
    report = dict(checkpoint=args.checkpoint, torch=torch.__version__, linears=[], forwards=[])
    if args.linears:
        for rows in (int(r) for r in args.rows.split(",")):
            for out_features, in_features in shapes_of(args.checkpoint):
                report["linears"].append(linear_rows(out_features, in_features, rows, args.repeats))
                print(json.dumps(report["linears"][-1]), file=sys.stderr, flush=True)
    for setting in filter(None, args.profile.split(",")):
        report["forwards"].append(profile(setting, args.repeats, args.top))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
