"""`caidllm bench --lengths 64,128,256,512`: the CAI-dLLM paper's length table (its Table 15's shape) in
one command: every method at every generation length on the same examples, tokens/s and speedup over the
first method (vanilla), one table and one plot (one line per method) beside results.md.

Before it starts the run says how long it expects and refuses a run past `--max-hours`
(bench/length_budget.py); `--limit` caps the examples.
The output folder gets its files only once every length has run: they are written to a temporary folder
beside it and moved in at the end, so a refused or interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

from caidllm.bench.length_budget import DEFAULT_MAX_HOURS, expected_seconds, task_sizes
from caidllm.errors import InputError

DEFAULT_BLOCK = 32  # the bench's block for block-wise methods when none is given (bench/cli.py)


def parse_lengths(text: str, block_length: int) -> list[int]:
    """The lengths of `--lengths` (comma-separated), each a positive multiple of the block length."""
    try:
        lengths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--lengths takes comma-separated integers, got {text!r}", field="lengths") from None
    if not lengths:
        raise InputError("--lengths names no length", field="lengths")
    for length in lengths:
        if length < 1 or length % block_length:
            raise InputError(
                f"--lengths: {length} is not a positive multiple of the block length "
                f"{block_length} "
                "(set --block-length or pick multiples of it)",
                field="lengths",
            )
    return sorted(set(lengths))


def table_rows(reports: dict[int, dict]) -> list[dict]:
    """One row per task, method and length: tokens/s, speedup over the first method, forwards, score."""
    rows = []
    for length, report in reports.items():
        for r in report["results"]:
            rows.append(
                dict(
                    task=r["task"],
                    method=r["method"],
                    gen_length=length,
                    tps=r["tps_answer"],
                    speedup=r["speedup"],
                    nfe=r["nfe_mean"],
                    accuracy=r["accuracy"],
                    n=r["n"],
                )
            )
    return rows


def markdown(rows: list[dict], lengths: list[int], methods: list[str], header: str) -> str:
    """The length table: per task, a line per method with tokens/s (speedup over the first method, forwards
    per question, accuracy) at each length."""
    lines = [header, ""]
    for task in dict.fromkeys(r["task"] for r in rows):
        lines += [
            f"### {task}",
            "",
            "| method | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        for method in methods:
            cells = []
            for n in lengths:
                row = next(
                    r for r in rows if r["task"] == task and r["method"] == method and r["gen_length"] == n
                )
                figures = f"{row['speedup']:.2f}x, {row['nfe']:.1f} fwd, {score(row)}"
                cells.append(f"{row['tps']:.1f} tok/s ({figures})")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def score(row: dict) -> str:
    """The row's accuracy in percent (n/a where the task has no score)."""
    return "n/a" if row["accuracy"] is None else f"{100 * row['accuracy']:.1f}%"


def plot(path: Path, rows: list[dict], lengths: list[int], methods: list[str]) -> None:
    """Tokens/s and speedup against the generation length, one line per method (first task)."""
    from caidllm.bench.plots import _figure

    task = rows[0]["task"]
    fig = _figure(width=10, height=4.2)
    panels = [("tps", "answer tokens/s"), ("speedup", f"speedup over {methods[0]} (x)")]
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        for method in methods:
            points = sorted(
                (r["gen_length"], r[key]) for r in rows if r["task"] == task and r["method"] == method
            )
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("generation length (tokens)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8, frameon=False)
    fig.suptitle(f"{task}: throughput against generation length")
    fig.savefig(path)


def run_lengths(settings, lengths: list[int], log, max_hours: float = DEFAULT_MAX_HOURS) -> dict:
    """Every length's bench run on one loaded model; the combined report (to settings.out at the end)."""
    from caidllm.bench.runner import _load_model, run_bench
    from caidllm.distributed import World

    world = World.from_env()
    settings.check()
    sizes = task_sizes(settings)  # a task that cannot be read fails before the model loads
    lm = _load_model(settings, world, world.device(settings.device), log)
    expected = expected_seconds(lm, settings, lengths, sizes, max_hours, log)  # refused past max_hours
    reports = {
        n: run_bench(dataclasses.replace(settings, gen_length=n, out=None), lm=lm, log=log) for n in lengths
    }
    rows = table_rows(reports)
    report = dict(
        lengths=lengths,
        methods=settings.methods,
        block_length=settings.block_length,
        rows=rows,
        settings=reports[lengths[0]]["settings"],
        expected_s=expected,
    )
    if settings.out:
        write(Path(settings.out), report)
    return report


def write(out: Path, report: dict) -> None:
    """results.json, results.md and lengths.png into `out`, all or nothing (built beside it, moved in)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        s = report["settings"]
        header = (
            f"## Length table: {s['model']} ({s['device']}), block {report['block_length']}, batch "
            f"{s['batch_size']}, speedup over {report['methods'][0]}"
        )
        with open(staging / "results.json", "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, ensure_ascii=False, allow_nan=False)
        (staging / "results.md").write_text(
            markdown(report["rows"], report["lengths"], report["methods"], header) + "\n", encoding="utf-8"
        )
        plot(staging / "lengths.png", report["rows"], report["lengths"], report["methods"])
        out.mkdir(exist_ok=True)
        for file in staging.iterdir():
            file.replace(out / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
