"""The prepared GPU check (one H200, at most 8 minutes, nothing downloaded).

    python benchmarks/gpu_check.py --out runs/gpu_check          # on the GPU machine
    python benchmarks/gpu_check.py --tiny --out /tmp/gc          # a reduced run on a CPU (seconds)

1. The GPU's bf16 matmul peak: a large GEMM (8192^3), timed with CUDA events.
2. random:llada-8b, random:dream-7b and random:llada2-mini (LLaDA2.0-mini: block-causal,
   256 experts routed top-8 by sigmoid group-limited scores, a shared expert; its block is
   its own, 32; and, before the compiled runs, its experts by the per-expert loop against the
   grouped kernel with their syncs per forward: gpu_check_moe.py) in bf16 (random weights, built on the GPU),
   batch 1 and 8, gen 256, block 64, methods vanilla / fastdllm / cai / es-dllm,
   without and then with --compile: the model forwards' TFLOP/s (FLOPs counted
   from each forward's shapes, time from the engine's forward timer) and their
   share of the measured peak, tokens/s (generated positions per second), peak
   memory, host syncs per step (bench/syncs.py), and torch.compile's graph count.
3. Quantized weights (torchao, --quantize): random:llada-8b in bf16, int8, int8-dynamic,
   int4 and fp8 (where the GPU has it), method cai, batch 1 and 8, not compiled:
   tokens/s, weights, the peak while loading (layer by layer) and while decoding.
   (--tiny: the tiny LLaDA shape in fp32, int8 and int8-dynamic on the CPU.)
4. Only where two GPUs are present: random:llada2-mini at --tp 1 and 2 (nccl): tokens equal,
   ms per step, share of the step in all-reduce (benchmarks/tensor_parallel.py).
It writes gpu_check.json and gpu_check.md into --out. A run that would pass the
time budget is skipped and listed as such (non-compiled runs go first).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import caidllm
from caidllm.bench.syncs import syncs_per_step
from caidllm.decode.engine import Engine
from caidllm.decode.presets import build_config

# its sibling gpu_check_moe, however this file is loaded
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_moe  # noqa: E402

METHODS = ("vanilla", "fastdllm", "cai", "es-dllm")
FULL = dict(
    models=("random:llada-8b", "random:dream-7b", "random:llada2-mini"),
    batches=(1, 8),
    gen=256,
    block=64,
    prompt=64,
    dtype="bfloat16",
    gemm=8192,
    quantize=(None, "int8", "int8-dynamic", "int4", "fp8"),
)
TINY = dict(
    models=(
        "random:llada-8b?n_layers=2&d_model=64&n_heads=4&n_kv_heads=4&mlp_hidden_size=128"
        "&embedding_size=512&vocab_size=512",
        "random:dream-7b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
        "&num_key_value_heads=2&intermediate_size=128&vocab_size=512",
        "random:llada2-mini?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
        "&num_key_value_heads=2&head_dim=16&rotary_dim=8&intermediate_size=128"
        "&moe_intermediate_size=16&num_experts=16&vocab_size=512",
    ),
    batches=(1, 2),
    gen=16,
    block=8,
    prompt=8,
    dtype="float32",
    gemm=256,
    quantize=(None, "int8", "int8-dynamic"),
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true", help="tiny random shapes, fp32: a CPU smoke run")
    p.add_argument("--budget-s", type=float, default=450.0, help="skip the runs left after this many seconds")
    p.add_argument("--no-compile", action="store_true", help="leave out the --compile runs")
    p.add_argument("--no-quantize", action="store_true", help="leave out the quantized runs")
    p.add_argument("--no-moe", action="store_true", help="leave out the MoE kernel rows")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument(
        "--models", help="comma-separated subset of the shape's models, by prefix (e.g. random:llada2-mini)"
    )
    args = p.parse_args(argv)
    shape = TINY if args.tiny else FULL
    if args.models:
        wanted = args.models.split(",")
        shape = {**shape, "models": tuple(m for m in shape["models"] if any(m.startswith(w) for w in wanted))}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    peak = gemm_peak(device, shape["gemm"], torch.float32 if args.tiny else torch.bfloat16)
    print(f"matmul peak: {peak / 1e12:.1f} TFLOP/s", file=sys.stderr)
    rows, quantized, moe = [], [], []
    for compiled in (False,) if args.no_compile else (False, True):
        if compiled and not args.no_moe:  # after the plain runs, before the compiled ones
            moe = gpu_check_moe.moe_kernel_runs(shape, device, args, started, peak, run_one)
        if compiled and not args.no_quantize:
            quantized = quantized_runs(shape, device, args, started, peak)
        for name in shape["models"]:
            if time.perf_counter() - started > args.budget_s:
                rows.append(dict(model=name, compile=compiled, skipped="time budget"))
                continue
            try:
                lm = caidllm.load(name, device=device, dtype=shape["dtype"], compile=compiled)
            except Exception as e:  # noqa: BLE001 - e.g. --compile where torch cannot: say so, go on
                rows.append(dict(model=name, compile=compiled, skipped=f"failed: {type(e).__name__}: {e}"))
                continue
            for batch in shape["batches"]:
                for method in args.methods.split(","):
                    if time.perf_counter() - started > args.budget_s:
                        rows.append(
                            dict(
                                model=name,
                                compile=compiled,
                                batch=batch,
                                method=method,
                                skipped="time budget",
                            )
                        )
                        continue
                    try:
                        rows.append(run_one(lm, name, method, batch, shape, compiled, peak))
                    except Exception as e:  # noqa: BLE001 - one failed run (e.g. out of memory) must not end the check
                        rows.append(
                            dict(
                                model=name,
                                compile=compiled,
                                batch=batch,
                                method=method,
                                skipped=f"failed: {type(e).__name__}: {str(e)[:200]}",
                            )
                        )
                    print(json.dumps(rows[-1]), file=sys.stderr)
            del lm
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.no_compile and not args.no_moe:
        moe = gpu_check_moe.moe_kernel_runs(shape, device, args, started, peak, run_one)
    report = dict(
        moe_kernels=moe,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        matmul_peak_tflops=peak / 1e12,
        tiny=args.tiny,
        wall_s=time.perf_counter() - started,
        runs=rows,
    )
    if args.no_compile and not args.no_quantize:
        quantized = quantized_runs(shape, device, args, started, peak)
    report["quantized"] = quantized
    report["tensor_parallel"] = tensor_parallel_rows(device, args.tiny)
    report["wall_s"] = time.perf_counter() - started
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def tensor_parallel_rows(device, tiny: bool):
    """4. Where two GPUs are present: random:llada2-mini at --tp 1 and 2 (nccl, bf16), tokens equal,
    ms per step, share in all-reduce (benchmarks/tensor_parallel.py); skipped elsewhere."""
    if tiny or device.type != "cuda" or torch.cuda.device_count() < 2:
        return "skipped: needs two GPUs"
    sys.path.insert(0, str(Path(__file__).parent))
    from tensor_parallel import table

    args = argparse.Namespace(
        model="random:llada2-mini",
        device="cuda",
        dtype="bfloat16",
        tp=[1, 2],
        method="cai",
        gen_length=64,
        block_length=32,
    )
    try:
        return table(args)
    except Exception as e:  # noqa: BLE001 - the rest of the check stands without it
        return f"failed: {type(e).__name__}: {str(e)[:200]}"


def quantized_runs(shape, device, args, started, peak) -> list[dict]:
    """The LLaDA shape with each quantization: cai at every batch size, weights and peaks."""
    from caidllm.models.quantize import weights_mb

    name, rows = (TINY if shape["gemm"] == TINY["gemm"] else FULL)["models"][0], []  # the LLaDA-8B shape
    for kind in shape["quantize"]:
        label = kind or shape["dtype"]
        if time.perf_counter() - started > args.budget_s:
            rows.append(dict(model=name, quantize=label, skipped="time budget"))
            continue
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            lm = caidllm.load(name, device=device, dtype=shape["dtype"], quantize=kind)
        except Exception as e:  # noqa: BLE001 - e.g. fp8 on a GPU without float8 tensor cores: say so, go on
            rows.append(dict(model=name, quantize=label, skipped=f"not available: {type(e).__name__}: {e}"))
            continue
        load_peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None
        for batch in shape["batches"]:
            try:
                row = run_one(lm, name, "cai", batch, shape, False, peak)
            except Exception as e:  # noqa: BLE001 - one failed run must not end the check
                row = dict(model=name, batch=batch, method="cai", skipped=f"failed: {type(e).__name__}: {e}")
            weights_gb = float(f"{weights_mb(lm) / 1024:.4g}")
            rows.append(dict(row, quantize=label, weights_gb=weights_gb, load_peak_gb=load_peak))
            print(json.dumps(rows[-1]), file=sys.stderr)
        del lm
    return rows


def gemm_peak(device, n: int, dtype) -> float:
    """FLOP/s of the best of a few n x n x n matmuls."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(10):
        seconds = _timed(device, lambda: a @ b)
        best = min(best, seconds)
    return 2 * n**3 / best


def _timed(device, fn) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000
    tick = time.perf_counter()
    fn()
    return time.perf_counter() - tick


class FlopCount:
    """Model FLOPs of each forward, from its shapes: 2 x weights x tokens for every
    projection and MLP, 4 x queries x keys x width for attention, the LM head on the
    targets only; early skipping's fewer positions at deeper layers are counted."""

    def __init__(self, lm):
        self.flops = 0.0
        c = lm.config
        d, q, kv = c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        # Per layer, the weights each token multiplies: MoE layers count the experts a token runs.
        self.layer_weights = [
            2 * d * q + 2 * d * kv + self.mlp_weights(c, layer) for layer in range(c.n_layers)
        ]
        self.width, self.head, self.n_layers = q, d * c.vocab_size, c.n_layers
        self.model = lm.model
        self._forward = lm.model.forward
        lm.model.forward = self

    def __call__(self, ids, ctx=None):
        R, n = ids.shape
        keys = ctx.mask.shape[1]
        extra = ctx.extra
        plan = getattr(ctx, "plan", None)  # only early skipping's context has one (models/modes/es.py)
        per_layer = [p + extra for p in plan] if plan else [n] * self.n_layers
        for weights, tokens in zip(self.layer_weights, per_layer):
            self.flops += 2 * weights * R * tokens + 4 * R * tokens * keys * self.width
        targets = n if ctx.targets is None else ctx.targets.shape[1]
        self.flops += 2 * self.head * R * targets
        return self._forward(ids, ctx)

    def remove(self):
        self.model.forward = self._forward

    @staticmethod
    def mlp_weights(c, layer: int) -> int:
        moe = c.moe
        if moe is None or layer < c.dense_layers:
            return 3 * c.hidden_size * c.intermediate_size
        return (
            3 * c.hidden_size * moe.moe_intermediate_size * moe.active_experts
            + moe.num_experts * c.hidden_size
        )


def run_one(lm, name, method, batch, shape, compiled, peak) -> dict:
    from caidllm.models.compiled import recompiles

    device = lm.device
    # A block-causal model decodes with its own block length (LLaDA2: 32), a whole number of them.
    block = lm.config.block_lengths[0] if lm.config.block_lengths else shape["block"]
    gen = -(-shape["gen"] // block) * block
    config = build_config(method, gen_length=gen, block_length=block, early_stop=False)
    prompts = [[7 + (i * 13 + j) % 200 for j in range(shape["prompt"] + i)] for i in range(batch)]
    # warm-up (and, compiled, the compile itself): one prompt's whole decode
    warm = Engine(lm, max_batch=batch)
    warm.submit(prompts[0], config)
    for _ in warm.run():
        pass
    # Host syncs per step, over a few steps of a separate decode (counting slows nothing measured below).
    probe = Engine(lm, max_batch=batch)
    for p in prompts:
        probe.submit(p, config)
    probe.step()  # admission copies each prompt in once (per request, not per step): not counted
    syncs, _ = syncs_per_step(probe, 6)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    graphs_before = recompiles() if compiled else 0
    engine = Engine(lm, max_batch=batch)
    counter = FlopCount(lm)
    try:
        tick = time.perf_counter()
        for p in prompts:
            engine.submit(p, config)
        for _ in engine.run():
            pass
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - tick
    finally:
        counter.remove()
    forward_s = engine.runner.forward_timer.total()
    policy_s = engine.runner.policy_timer.total()
    tflops = counter.flops / forward_s / 1e12 if forward_s > 0 else None
    return dict(
        model=name.split("?")[0] + ("?..." if "?" in name else ""),
        method=method,
        batch=batch,
        compile=compiled,
        wall_s=round(wall, 4),
        steps=engine.steps,
        forwards=engine.runner.forwards,
        block=block,
        tokens_per_s=round(batch * gen / wall, 2),
        forward_share=round(forward_s / wall, 4),
        engine_overhead_share=round((wall - forward_s - policy_s) / wall, 4),
        forward_tflops=None if tflops is None else float(f"{tflops:.4g}"),
        peak_share=None if tflops is None else float(f"{tflops * 1e12 / peak:.4g}"),
        peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
        syncs_per_forward=round(syncs, 3),
        new_graphs=(recompiles() - graphs_before) if compiled else None,
    )


def markdown(report: dict) -> str:
    lines = [
        f"# GPU check: {report['device']}, torch {report['torch']}",
        "",
        f"bf16 matmul peak (measured): {report['matmul_peak_tflops']:.1f} TFLOP/s. Random weights: "
        "only speed and memory mean anything. Tokens/s = generated positions per second.",
        "",
        "| Model | Compile | Batch | Method | Block | Tokens/s | Fwd TFLOP/s | % of peak | Fwd share | "
        "Overhead | "
        "Peak mem (GB) | Syncs/forward | New graphs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        if "skipped" in r:
            lines.append(
                f"| {r['model']} | {r['compile']} | {r.get('batch', '-')} | {r.get('method', 'all')} | "
                f"| skipped: {r['skipped']} | | | | | | | |"
            )
            continue
        pct = "n/a" if r["peak_share"] is None else f"{100 * r['peak_share']:.1f}%"
        lines.append(
            f"| {r['model']} | {r['compile']} | {r['batch']} | {r['method']} | {r['block']} | "
            f"{r['tokens_per_s']} | "
            f"{r['forward_tflops']} | {pct} | {100 * r['forward_share']:.1f}% | "
            f"{100 * r['engine_overhead_share']:.1f}% | {r['peak_mem_gb']} | {r['syncs_per_forward']} | "
            f"{r['new_graphs']} |"
        )
    if report.get("quantized"):
        lines += [
            "",
            "Quantized weights (torchao; cai, not compiled; Fwd TFLOP/s counts the full-precision FLOPs):",
            "",
            "| Model | Weights | Batch | Tokens/s | Fwd TFLOP/s | Weights (GB) | Load peak (GB) | "
            "Decode peak (GB) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in report["quantized"]:
            if "skipped" in r:
                lines.append(
                    f"| {r['model']} | {r['quantize']} | {r.get('batch', '-')} | skipped: {r['skipped']} "
                    "| | | | |"
                )
                continue
            lines.append(
                f"| {r['model']} | {r['quantize']} | {r['batch']} | {r['tokens_per_s']} | "
                f"{r['forward_tflops']} | {r['weights_gb']} | {r['load_peak_gb']} | {r['peak_mem_gb']} |"
            )
    return "\n".join(lines) + "\n" + gpu_check_moe.markdown(report)


if __name__ == "__main__":
    sys.exit(main())
