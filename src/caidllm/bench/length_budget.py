"""How long a `caidllm bench --lengths` run expects to take, said before it starts, and the refusal of one
past `--max-hours` (default 1 hour): nothing decoded for the table, nothing written.

Two estimates, the cheap one first. (1) An upper bound from one timed forward per length on the loaded
model: every method one forward per generated position (as vanilla without early stop), for every batch
of every task's examples. When it fits the budget the run goes. (2) Otherwise each method's first batch is
decoded and timed at the longest length (the run's settings, the first task's first examples), and taken
for every batch at every length: early stop and the cached methods' few forwards are then counted as they
are, at the price of one batch per method. Past the budget the run is refused, naming the `--limit` that
fits (both estimates grow about linearly with the examples).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from caidllm.errors import InputError

PROMPT_ALLOWANCE = 64  # prompt positions assumed by the timed forward
DEFAULT_MAX_HOURS = 1.0


def check_max_hours(value: float | None) -> float:
    """--max-hours: a positive number of hours (None: the default)."""
    if value is None:
        return DEFAULT_MAX_HOURS
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"--max-hours must be a positive number of hours, got {value:g}", field="max_hours")
    return value


def task_sizes(settings) -> list[int]:
    """How many examples each task of the run evaluates (its file's, capped by --limit)."""
    from caidllm.bench.tasks import load_task

    data_dir = Path(settings.data_dir).expanduser() if settings.data_dir else None
    return [
        len(load_task(spec, data_dir=data_dir, limit=settings.limit, fewshot=settings.fewshot).samples)
        for spec in settings.tasks
    ]


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


def upper_bound(lm, settings, lengths: list[int], batches: int) -> float:
    """Estimate (1): each method one forward per generated position on every batch, at every length."""
    per_method = sum(seconds_per_forward(lm, settings.batch_size, n) * n * batches for n in lengths)
    return per_method * len(settings.methods)


def first_batches(lm, settings, length: int) -> float:
    """Estimate (2)'s measure: the seconds each method's first batch takes at `length`, summed."""
    from caidllm.bench.runner import run_bench

    probe = dataclasses.replace(
        settings,
        tasks=settings.tasks[:1],
        limit=min(settings.limit or settings.batch_size, settings.batch_size),
        gen_length=length,
        warmup=False,
        out=None,
        progress=False,
    )
    report = run_bench(probe, lm=lm, log=lambda message: None)
    return sum(row["wall_s"] for row in report["results"])


def expected_seconds(lm, settings, lengths: list[int], sizes: list[int], max_hours: float, log) -> float:
    """The run's expected time (said in the log); InputError past `max_hours`."""
    batches = sum(math.ceil(n / settings.batch_size) for n in sizes) + (1 if settings.warmup else 0)
    head = f"lengths {lengths}, block {settings.block_length}, {sum(sizes)} examples"
    bound = upper_bound(lm, settings, lengths, batches)
    if bound <= max_hours * 3600:
        log(
            f"{head}: expected at most ~{bound:.0f} s (a timed forward; every method one forward per "
            "generated position, early stop ends sooner); --limit caps the examples"
        )
        return bound
    longest = max(lengths)
    log(
        f"{head}: the upper bound is ~{bound / 3600:.1f} h; timing each method's first batch at {longest} ..."
    )
    expected = first_batches(lm, settings, longest) * batches * len(lengths)
    basis = f"each method's first batch at {longest} tokens, for every batch and length"
    log(f"{head}: expected at most ~{expected:.0f} s ({basis}); --limit caps the examples")
    if expected > max_hours * 3600:
        most = max(sizes)
        fits = int(most * max_hours * 3600 / expected)
        advice = f"give --limit {fits} or less" if fits >= 1 else "pick shorter --lengths or fewer --methods"
        raise InputError(
            f"--lengths: expected ~{expected / 3600:.1f} h ({basis}) on {most} examples per task, past "
            f"--max-hours {max_hours:g}; {advice}, or raise --max-hours",
            field="lengths",
        )
    return expected
