"""results.json and results.md (a table per task, like the paper's Tables 1-2)."""

from __future__ import annotations

import json
from pathlib import Path

from caidllm.decode.setting_names import OWNERS


def _num(value, fmt: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, fmt)


def _score(row: dict) -> str:
    if row["accuracy"] is None:
        return "n/a"
    text = f"{100 * row['accuracy']:.2f}"
    if row["stderr"] is not None:
        text += f" ± {100 * row['stderr']:.2f}"
    return text


def _steps(row: dict) -> str:
    return " / ".join(_num(v, ".1f", "-") for v in row["steps_per_block"])


def _share(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = _preamble(s)
    by_task: dict[str, list[dict]] = {}
    for row in report["results"]:
        by_task.setdefault(row["task"], []).append(row)
    for task, rows in by_task.items():
        lines += _task_section(task, rows, s)
    if report.get("plots"):
        lines += ["## Figures", ""] + [f"![{name}]({file})" for name, file in report["plots"].items()] + [""]
    return "\n".join(lines)


def _preamble(s: dict) -> list[str]:
    """The title, the run's settings in one paragraph, and what each column means."""
    gpu = f" ({s['gpu']})" if s["gpu"] else ""
    memory = (
        "CUDA max allocated, reset per method"
        if s["device"].startswith("cuda")
        else "peak RSS of the whole process so far (not per method)"
    )
    world = s.get("world_size", 1)
    ranks = (
        f" x {world} ranks (torchrun; wall = the slowest rank's, throughput over all samples)"
        if world > 1
        else ""
    )
    quantized = (
        (
            f"; {s['quantization']} linear layers ({s['quantization_summary']}) through torchao "
            f"{s['torchao']}" + (", the output head too" if s.get("quantized_head") else "")
        )
        if s.get("quantization")
        else ""
    )
    lines = [
        "# caidllm bench results",
        "",
        f"Model `{s['model']}` ({s['family']}, {s['dtype']}{quantized}) on {s['device']}{gpu}{ranks}; "
        f"gen_length {s['gen_length']}, block_length {s['block_length']}, batch size {s['batch_size']}, "
        f"temperature {s['temperature']}, early stop {'on' if s['early_stop'] else 'off'}, "
        f"chat template {'on' if s['chat_template'] else 'off'}, seed {s['seed']}. "
        f"Warm-up: {s['warmup']}. Started {s['started']}.",
        "",
        "TPS = answer tokens per second (tokens up to the first end token, prompt never counted); "
        "Pos/s = generated positions per second (n x gen_length / wall). Speedup = wall-clock time of "
        f"`{s['baseline']}` / wall-clock time of the method on the same examples. Score in % with its "
        "standard "
        "error. NFE = forward passes per request (mean). Steps/block = mean denoising steps per block index. "
        f"Memory: {memory}; Weights = bytes of the model's parameters and buffers. "
        "Energy in joules, n/a where not measurable. Ctrl = share of wall time spent in the commit policy; "
        "Fwd = inside the model forwards; Ovh = the engine's own overhead (wall - forwards - policy).",
        "",
    ]
    if s.get("random_weights"):
        lines[2:2] = ["**The weights are random: scores mean nothing; only speed and memory do.**", ""]
    ran = s.get("settings_file")
    if ran:
        own = [fields for owner, fields in ran.items() if owner in OWNERS]  # the method's settings, by owner
        values = ", ".join(f"{k}={v}" for fields in own for k, v in fields.items()) or "none"
        lines += [
            f"Settings file `{ran['source']}`: row `{ran['name']}` is `{ran['method']}` with {values}.",
            "",
        ]
    return lines


def _task_section(task: str, rows: list[dict], s: dict) -> list[str]:
    """One task: its metric and source, a table with a row per method, then its notes."""
    first = rows[0]
    shots = f"{first['fewshot']}-shot" if first["fewshot"] else "zero-shot"
    lines = [
        f"## {task}",
        "",
        f"Metric: {first['metric']}, n = {first['n']}, {shots}. Source: `{s['task_sources'][task]}`.",
        "",
    ]
    extra = [k for k in first if k.startswith("accuracy_")]
    header = ["Method", "TPS", "Pos/s", "Speedup", "Score ± stderr"] + [
        k.removeprefix("accuracy_") for k in extra
    ]
    header += [
        "NFE",
        "NFE ratio",
        "Prefill/req",
        "Saved",
        "Steps/block",
        "Weights (MB)",
        "Peak mem (MB)",
        "Energy (J)",
        "Ctrl",
        "Fwd",
        "Ovh",
        "Errors",
    ]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(_cells(row, extra)) + " |" for row in rows]
    notes = s.get("task_notes", {}).get(task)
    if notes:
        lines += ["", f"Note: {notes}."]
    blocks = _block_notes(rows, s)
    if blocks:
        lines += ["", *blocks]
    energy_notes = {row["energy_note"] for row in rows if row.get("energy_note")}
    if energy_notes:
        lines += ["", "Energy: " + "; ".join(sorted(energy_notes)) + "."]
    lines.append("")
    return lines


def _block_notes(rows: list[dict], s: dict) -> list[str]:
    """A line for each row whose method decoded with another block length than the run's."""
    return [
        f"Block: `{row['method']}` decodes the whole generation as one block of {row['block_length']} "
        f"(Elastic-Cache's official loop, elastic_scope 'generation'); block_length {s['block_length']} "
        "does not apply to it (`elastic-block` is the same rule in blocks)."
        for row in rows
        if row.get("block_length", s["block_length"]) != s["block_length"]
    ]


def _cells(row: dict, extra: list[str]) -> list[str]:
    """One method's row of the task table, in the header's order."""
    cells = [
        row["method"],
        _num(row["tps_answer"], ".1f"),
        _num(row["tps_positions"], ".1f"),
        _num(row["speedup"], ".2f") + ("x" if row["speedup"] is not None else ""),
        _score(row),
    ]
    cells += [_num(None if row[k] is None else 100 * row[k], ".2f") for k in extra]
    cells += [
        _num(row["nfe_mean"], ".1f"),
        _num(row["nfe_ratio"], ".2f"),
        _num(row.get("prefill_positions_mean"), ".1f"),
        _share(row.get("prefill_saved_share")),
        _steps(row),
        _num(row.get("weights_mb"), ".1f"),
        _num(row["peak_mem_mb"], ".0f"),
        _num(row["energy_j"], ".1f"),
        _num(None if row["policy_share"] is None else 100 * row["policy_share"], ".1f", "n/a")
        + ("%" if row["policy_share"] is not None else ""),
        _share(row.get("forward_share")),
        _share(row.get("engine_overhead_share")),
        str(row["errors"]),
    ]
    return cells


def write(out: Path, report: dict) -> None:
    with open(out / "results.json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False, allow_nan=False)
        f.write("\n")
    (out / "results.md").write_text(markdown(report), encoding="utf-8")
