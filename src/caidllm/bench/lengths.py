"""`caidllm bench --lengths 64,128,256,512`: the CAI-dLLM paper's length table (its Table 15's shape) in
one command: every method at every generation length on the same examples, tokens/s and speedup over the
first method (vanilla), one table and one plot (one line per method) beside results.md.

Before it starts the run says how long it expects: an upper bound from one timed forward per length on
the model loaded, times the forwards the slowest method could take (every method as slow as vanilla: one
forward per generated position), times the batches of the examples each task holds (`--limit` caps them).
Past `--max-hours` (default 1) the run is refused before it decodes anything, naming a `--limit` that fits.
The output folder gets its files only once every length has run: they are written to a temporary folder
beside it and moved in at the end, so a refused or interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from caidllm.errors import InputError

DEFAULT_BLOCK = 32  # the bench's block for block-wise methods when none is given (bench/cli.py)
PROMPT_ALLOWANCE = 64  # prompt positions assumed by the time estimate
DEFAULT_MAX_HOURS = 1.0  # the expected upper bound past which a run is refused (--max-hours)


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


def check_max_hours(value: float | None) -> float:
    """--max-hours: a positive number of hours (None: the default)."""
    if value is None:
        return DEFAULT_MAX_HOURS
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"--max-hours must be a positive number of hours, got {value:g}", field="max_hours")
    return value


def seconds_per_forward(lm, batch_size: int, length: int) -> float:
    """One timed forward over a batch of canvases of `length` answer positions (after one untimed)."""
    ids = torch.full(
        (batch_size, PROMPT_ALLOWANCE + length), lm.config.mask_id, dtype=torch.long, device=lm.device
    )
    with torch.inference_mode():
        lm.logits(ids)
        started = time.perf_counter()
        lm.logits(ids)
    return time.perf_counter() - started


def expected_seconds(lm, settings, lengths: list[int], sizes: list[int]) -> float:
    """An upper bound of the run's decoding time: each method as slow as vanilla (gen_length forwards per
    batch) on each task's `sizes` examples, plus one warm-up batch per method and length."""
    warmup = 1 if settings.warmup else 0
    batches = sum(math.ceil(n / settings.batch_size) for n in sizes) + warmup
    per_method = sum(seconds_per_forward(lm, settings.batch_size, n) * n * batches for n in lengths)
    return per_method * len(settings.methods)


def task_sizes(settings) -> list[int]:
    """How many examples each task of the run evaluates (its file's, capped by --limit)."""
    from caidllm.bench.tasks import load_task

    data_dir = Path(settings.data_dir).expanduser() if settings.data_dir else None
    return [
        len(load_task(spec, data_dir=data_dir, limit=settings.limit, fewshot=settings.fewshot).samples)
        for spec in settings.tasks
    ]


def check_bound(bound: float, sizes: list[int], max_hours: float) -> None:
    """InputError (exit 2, nothing written) when the expected upper bound passes `max_hours`; it names the
    largest --limit that fits."""
    if bound <= max_hours * 3600:
        return
    most = max(sizes)
    fits = int(most * max_hours * 3600 / bound)  # the bound grows about linearly with the examples
    advice = f"give --limit {fits} or less" if fits >= 1 else "pick shorter --lengths or fewer --methods"
    raise InputError(
        f"--lengths: expected up to ~{bound / 3600:.1f} h (an upper bound: every method one forward per "
        f"generated position) on {most} examples per task, past --max-hours {max_hours:g}; {advice}, or "
        "raise --max-hours",
        field="lengths",
    )


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
    bound = expected_seconds(lm, settings, lengths, sizes)
    log(
        f"lengths {lengths}, block {settings.block_length}, {sum(sizes)} examples: expected at most "
        f"~{bound:.0f} s (every method as slow as vanilla; early stop ends far sooner); --limit caps the "
        "examples"
    )
    check_bound(bound, sizes, max_hours)
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
        expected_upper_bound_s=bound,
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
