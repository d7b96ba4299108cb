"""gpu_check.py's mixture-of-experts rows (imported by it; not a script of its own).

1. LLaDA2.0-mini's shape with every layer (random:llada2-mini: 20 layers, 256 experts top-8
   plus a shared one) in bf16, method fastdllm, batch 1 and 8, its experts run by the per-expert
   loop (the reference, one host sync per MoE layer) and by the grouped kernel (moe_kernels.py):
   tokens/s, forward TFLOP/s and the host syncs per forward (the grouped kernel adds none).
   (--tiny: a 2-layer, 16-expert LLaDA2 shape in fp32 on the CPU.)

The --tp 2 row (LLaDA2.0-mini at tp 1 and 2, only where two GPUs are present) is the tensor
parallelism work's own (benchmarks/tensor_parallel.py, issue 33 part 2), in gpu_check.py.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import caidllm
from caidllm.models.moe import set_moe_kernel

KERNELS = ("loop", "grouped")
FULL_MODEL = "random:llada2-mini"
TINY_MODEL = (
    "random:llada2-mini?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
    "&head_dim=16&rotary_dim=8&intermediate_size=128&moe_intermediate_size=16&num_experts=16&vocab_size=512"
)


def moe_kernel_runs(shape, device, args, started, peak, run_one) -> list[dict]:
    """LLaDA2.0-mini (every layer) with each MoE kernel: run_one's figures, one row per kernel and batch."""
    name = TINY_MODEL if args.tiny else FULL_MODEL
    rows = []
    try:
        lm = caidllm.load(name, device=device, dtype=shape["dtype"])
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: say so, go on
        return [dict(model=name, moe_kernel="all", skipped=f"failed: {type(e).__name__}: {str(e)[:200]}")]
    for batch in shape["batches"]:
        for kernel in KERNELS:
            if time.perf_counter() - started > args.budget_s:
                rows.append(dict(model=name, moe_kernel=kernel, batch=batch, skipped="time budget"))
                continue
            set_moe_kernel(lm.model, kernel)
            try:
                rows.append(dict(run_one(lm, name, "fastdllm", batch, shape, False, peak), moe_kernel=kernel))
            except Exception as e:  # noqa: BLE001 - one failed run must not end the check
                rows.append(
                    dict(
                        model=name,
                        moe_kernel=kernel,
                        batch=batch,
                        skipped=f"failed: {type(e).__name__}: {str(e)[:200]}",
                    )
                )
            print(json.dumps(rows[-1]), file=sys.stderr)
    del lm
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def markdown(report: dict) -> str:
    lines = _table(
        "Mixture-of-experts kernels (LLaDA2.0-mini shape, every layer, fastdllm)",
        ("Kernel", "Batch", "Tokens/s", "Forward TFLOP/s", "Syncs / forward", "Peak GB"),
        report.get("moe_kernels"),
        ("moe_kernel", "batch"),
        ("tokens_per_s", "forward_tflops", "syncs_per_forward", "peak_mem_gb"),
    )
    return "\n".join(lines) + ("\n" if lines else "")


def _table(title: str, header: tuple, rows, keys: tuple, figures: tuple) -> list[str]:
    """A Markdown table of `rows`: the `keys` columns, then the figures, or the reason it was skipped."""
    if not rows:
        return []
    lines = ["", f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [str(r.get(k, "")) for k in keys]
        if "skipped" in r:
            cells += [f"skipped: {r['skipped']}"] + [""] * (len(figures) - 1)
        else:
            cells += [str(r.get(f, "")) for f in figures]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
