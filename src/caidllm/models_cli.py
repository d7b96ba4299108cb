"""`caidllm models`: the families and known checkpoints (models/inventory.py), and with
--model the memory a model's weights and one request's cache need: what to check before
renting a GPU. --json prints the same as one JSON object."""

from __future__ import annotations

import argparse
import json

from caidllm.options import add_quantize_arguments

EPILOG = """\
examples:
  caidllm models
  caidllm models --model inclusionAI/LLaDA-MoE-7B-A1B-Instruct --dtype bfloat16 --length 4096
  caidllm models --model /path/to/folder --json
  caidllm models --plan random:llada2-flash --tp 4 --gpu-memory 80 --context 4096
"""


def register(sub, name: str = "models") -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help="list the model families and known checkpoints; a model's memory needs",
        description="The families caidllm runs and the public checkpoints it knows (hub id, "
        "architecture, parameters total / active per token, context, decoders and cache "
        "modes, recommended settings). With --model: the memory its weights need in "
        "--dtype and the cache one request needs at --length positions (read from "
        "config.json alone; a known checkpoint needs no download).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, help="a folder, a hub id ORG/NAME[@REVISION], or random:SHAPE")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16 or float32")
    p.add_argument(
        "--length",
        type=int,
        default=None,
        help="positions of one request (prompt + answer) for the cache figure (default: the context)",
    )
    add_quantize_arguments(p)
    p.add_argument(
        "--plan",
        default=None,
        metavar="MODEL",
        help="a memory plan for MODEL over --tp GPUs: weights per rank, KV cache per request at "
        "--context, how many requests fit in --gpu-memory (models/plan.py)",
    )
    p.add_argument(
        "--tp", type=int, default=1, help="with --plan: GPUs the model is divided among (default 1)"
    )
    p.add_argument(
        "--gpu-memory",
        type=float,
        default=80.0,
        metavar="GIB",
        help="with --plan: memory of one GPU in GiB (default 80)",
    )
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help="with --plan: positions of one request (default: the model's context)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from caidllm.decode.block_diffusion import ModelTraits, applicable
    from caidllm.decode.diffusiongemma_settings import uniform_settings_lines, uniform_settings_table
    from caidllm.decode.setting_names import settings_lines, settings_table
    from caidllm.models.device import resolve_dtype
    from caidllm.models.inventory import checkpoint_rows, describe, family_rows, model_memory

    if args.plan is not None:
        return run_plan(args)
    if args.model is not None:
        dtype = resolve_dtype(args.dtype)  # a bad dtype fails before anything is read
        described = describe(args.model)
        length = described.config.max_length if args.length is None else args.length
        memory = model_memory(described, dtype, length, args.quantize, args.quantize_head)
        if described.checkpoint is not None:
            memory["recommended"] = described.checkpoint.recommended.summary()
        print(json.dumps(memory) if args.json else "\n".join(memory_lines(memory)))
        return 0
    families, checkpoints = family_rows(), checkpoint_rows()
    for row in families + checkpoints:  # read from the decode registries: they cannot go stale
        traits = ModelTraits(row["family"], row["block_causal"], tuple(row["block_lengths"]))
        row["decoders"], row["cache_modes"] = applicable(traits)
    if args.json:
        tables = {"settings": settings_table(), "uniform_settings": uniform_settings_table()}
        print(json.dumps({"families": families, "checkpoints": checkpoints, **tables}))
    else:
        lines = [*table_lines(families, checkpoints), "", *settings_lines(), "", *uniform_settings_lines()]
        print("\n".join(lines))
    return 0


def run_plan(args) -> int:
    from caidllm.errors import InputError
    from caidllm.models.device import resolve_dtype
    from caidllm.models.inventory import describe
    from caidllm.models.plan import memory_plan, plan_lines

    if args.model is not None or args.quantize is not None or args.quantize_head:
        raise InputError(
            "--plan MODEL takes its model itself and plans unquantized weights: "
            "drop --model / --quantize / --quantize-head"
        )
    dtype = resolve_dtype(args.dtype)
    described = describe(args.plan)
    context = described.config.max_length if args.context is None else args.context
    plan = memory_plan(described, args.tp, dtype, args.gpu_memory, context)
    print(json.dumps(plan.to_dict()) if args.json else "\n".join(plan_lines(plan)))
    return 0


def kind_decoders(rows: list[dict]) -> list[str]:
    """The decoders that run on some family of a kind (a family may refuse one: S2D2's AR-like caching, the
    `s2d2` preset's, is SDAR's loop, not LLaDA2's), in the preset registry's order."""
    from caidllm.decode.methods import PRESETS

    order = {name: i for i, name in enumerate(PRESETS)}
    names = dict.fromkeys(name for row in rows for name in row["decoders"])
    return sorted(names, key=lambda name: order.get(name, len(order)))


def table_lines(families: list[dict], checkpoints: list[dict]) -> list[str]:
    lines = ["Families (config.json architectures / model_type):"]
    for f in families:
        model_types = ", ".join(f["model_types"]) or "none of its own"  # Stable-DiffCoder says "llama"
        lines.append(
            f"  {f['family']:<11} {', '.join(f['architectures'])} / {model_types}: {f['description']}"
        )
    lines += ["", "Known checkpoints (parameters: total / active per token; chat: instruct, else raw text):"]
    header = (
        f"  {'hub id':<39} {'family':<11} {'architecture':<25} {'params':>14} {'context':>7} {'chat':<5} "
        "recommended"
    )
    lines.append(header)
    for c in checkpoints:
        r = c["recommended"]
        params = f"{c['parameters_total'] / 1e9:.2f}B/{c['parameters_active'] / 1e9:.2f}B"
        threshold = f" (threshold {r['threshold']:g})" if r.get("threshold") is not None else ""
        decoder = f"{r['decoder']}{threshold}, " if r.get("decoder") else ""  # sdar-static: no threshold
        lines.append(
            f"  {c['hub_id']:<39} {c['family']:<11} {c['architecture']:<25} {params:>14} {c['context']:>7} "
            f"{'yes' if c['instruct'] else 'no':<5} {decoder}gen {r['gen_length']}, block "
            f"{r['block_length']}, steps {r['steps']}, T {r['temperature']:g}{controller(r, c['family'])}"
        )
    lines.append("")
    for kind, block_causal, uniform, sequential in (
        ("full-sequence", False, False, False),
        ("block-diffusion", True, False, False),
        ("uniform-state", True, True, False),
        ("causal + bidirectional (sequential)", False, False, True),
    ):
        rows = [
            f
            for f in families
            if f["block_causal"] is block_causal
            and f.get("uniform", False) is uniform
            and f.get("sequential", False) is sequential
        ]
        if rows:
            lines += [
                f"Decoders (--method) of {kind} models: {', '.join(kind_decoders(rows))}",
                f"Cache modes (--cache) of {kind} models: {', '.join(rows[0]['cache_modes'])}",
            ]
    lines.append(
        "Sources of the recommended settings: caidllm models --json (checkpoints[].recommended.source)."
    )
    return lines


def controller(r: dict, family: str) -> str:
    """The CAI controller's gating and cache refresh of a row; none on a uniform-state model (its decoders
    have neither: steps are its denoising steps per canvas, T its temperature schedule's start)."""
    from caidllm.models.families import get_family

    if get_family(family).uniform:
        return ""
    return f", gating {'on' if r['confidence_gating'] else 'off'}, f {r['refresh_every']}"


def quantized(m: dict) -> str:
    if not m.get("quantization"):
        return ""
    head = m.get("head_quantization")
    if not m.get("quantized_head"):
        return f", {m['quantization']} linear layers"
    return f", {m['quantization']} linear layers and " + (
        "head" if head == m["quantization"] else f"{head} head"
    )


CACHE_ORDER = ("dual", "prefix", "es", "block", "subblock", "canvas", "kv", "none")


def memory_lines(m: dict) -> list[str]:
    gib = 1024**3
    cache = m["cache_bytes_per_request"]
    lines = [
        f"{m['model']} ({m['family']}): {m['parameters_total']:,} parameters, {m['parameters_active']:,} "
        f"active per token; context {m['context']}",
        f"weights in {m['dtype']}{quantized(m)}: {m['weights_bytes'] / gib:.2f} GiB",
        f"cache per request at {m['length']} positions: "
        + ", ".join(f"{mode} {cache[mode] / gib:.3f} GiB" for mode in sorted(cache, key=CACHE_ORDER.index)),
    ]
    if "recommended" in m:
        lines.append(f"recommended: {m['recommended']}")
    return lines
