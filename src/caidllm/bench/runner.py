"""The side-by-side benchmark: every method on the same examples, in one
process or in several under torchrun (each rank takes every world_size-th
sample of each task; rank 0 gathers them and writes the report).

    from caidllm.bench import BenchConfig, run_bench
    results = run_bench(BenchConfig(model="tiny", tasks=["synthetic:arithmetic"],
                                      methods=["vanilla", "fastdllm", "cai"], limit=64, out="runs/bench"))

Order of work: check every setting and the output directory, load every
task (data errors surface before the model loads), load the model, tokenise
each prompt once (the same token ids go to every method), one warm-up batch
per method, then for each task and each method: reset the peak-memory
counter, start the energy meter, decode all examples batch by batch (only
the `generate` calls are timed; scoring comes after the clock stops), stop
the meters, score every sample (a scorer crash is recorded for that sample
and the run goes on). Under torchrun every rank does all of this on its
share (bench/shard.py), starting each method together (a barrier); rank 0
builds each row from all shares (bench/summary.py). If any rank fails, every
rank fails with its error (distributed.together): never a report of a subset.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from caidllm.bench.config import BenchConfig, resolve_lengths
from caidllm.bench.run_info import DEFINITIONS, run_settings
from caidllm.bench.sandbox import Limits
from caidllm.bench.shard import Encoded, ShardRun, run_shard, sync
from caidllm.bench.summary import CONFIDENCE_BUCKETS, build_row, new_trace_store, relative
from caidllm.bench.tasks import BenchTask, Sample, load_task
from caidllm.bench.uniform_rows import uniform_summary
from caidllm.decode.diffusiongemma_settings import DiffusionGemmaSettings
from caidllm.decode.methods import settings_summary
from caidllm.decode.nemotron import SequentialSettings
from caidllm.distributed import World, together
from caidllm.errors import CaidllmError, InputError
from caidllm.models.quantize import weights_mb


def _check_not_calibrated_on(settings: BenchConfig, tasks: list[BenchTask]) -> None:
    """A settings file's held-out samples must not be evaluated: that would grade it on its own training
    set."""
    loaded = settings.loaded_settings()
    for task in tasks if loaded is not None else ():
        seen = loaded.held_out_ids(task.name)
        overlap = [s.id for s in task.samples if s.id in seen]
        if overlap:
            raise InputError(
                f"settings file {settings.settings_file} was calibrated on {len(overlap)} of the "
                f"samples of {task.name} evaluated here (first: {overlap[0]}); evaluate other samples "
                "(e.g. a smaller --limit) or calibrate on a disjoint slice"
            )


# ---- entry point -------------------------------------------------------------


def run_bench(settings: BenchConfig, lm=None, log=None) -> dict | None:
    """Run the benchmark; returns the results object (also written to
    settings.out when given); under torchrun, on rank 0 only (None on the
    others). `lm`: an already loaded DiffusionLM to use instead of loading
    settings.model."""
    world = World.from_env()
    log = log or (lambda message: print(message, file=sys.stderr))
    if not world.is_main:  # rank 0 speaks for the run
        log = _quiet
        settings = dataclasses.replace(settings, progress=False)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    settings.check()
    device = world.device(settings.device)
    world.init(device)
    with together(world):  # a bad setting, data file or model fails every rank with the same error
        run = _prepare(settings, lm, world, device, log)
    traces = {m: new_trace_store() for m in run.settings.methods}
    results = _run_every_method(run, world, traces, log)
    ranks = world.all_gather({"host": platform.node(), "device": str(run.lm.device)})
    if not world.is_main:
        return None

    report = {
        "settings": {
            **run_settings(run.settings, run.lm, run.tasks, run.data_dir, run.chat, run.T),
            "method_settings": run.method_settings,
            "started": started,
            "world_size": world.world_size,
            "ranks": ranks,
        },
        "definitions": DEFINITIONS,
        "results": results,
    }
    if run.out is not None:
        from caidllm.bench import plots
        from caidllm.bench import report as report_mod

        report["plots"] = plots.write_all(run.out, report, traces, run.T)
        report_mod.write(run.out, report)
    return report


@dataclass
class _Prepared:
    """A run set up on one rank: settings with their lengths resolved, the model, the tasks, each
    prompt tokenised once (the same ids go to every method), and each method's most steps per block."""

    settings: BenchConfig
    lm: object
    out: Path | None
    data_dir: Path | None
    tasks: list[BenchTask]
    chat: bool
    encoded: dict[str, list[Encoded]]
    T: dict[str, int]
    # each row's policy and cache settings, by owner (methods.settings_summary)
    method_settings: dict[str, dict]


def _prepare(settings: BenchConfig, lm, world: World, device, log) -> _Prepared:
    """Everything before the clock, in the order that fails cheapest first: the output folder, the
    data, the lengths against config.json, only then the model; then the prompts and a warm-up."""
    out = _prepare_out(settings.out) if world.is_main else None
    data_dir = Path(settings.data_dir).expanduser() if settings.data_dir else None
    limits = Limits(timeout_s=float(settings.code_timeout))
    tasks = [
        load_task(
            spec,
            data_dir=data_dir,
            limit=settings.limit,
            fewshot=settings.fewshot,
            seed=settings.seed,
            code_limits=limits,
        )
        for spec in settings.tasks
    ]
    _check_not_calibrated_on(settings, tasks)
    settings = resolve_lengths(settings, lm)  # from config.json alone: a bad setting fails before loading
    if lm is None:
        lm = _load_model(settings, world, device, log)
    if getattr(lm, "random_weights", False):
        log(f"{settings.model}: the weights are random; scores mean nothing, only speed and memory do")
    torch.manual_seed(settings.seed)
    # A base checkpoint (models/checkpoints.py) reads raw prompts, as does a tokenizer without a template.
    chat = settings.chat and bool(getattr(lm.tokenizer, "chat_template", None)) and lm.chat_default
    encoded = {t.name: [_encode(lm, s, chat, settings.gen_length) for s in t.samples] for t in tasks}
    for m in settings.methods:
        if settings.lengths_for(m)["block_length"] is None:
            log(
                f"{m}: Elastic-Cache's official loop decodes the whole generation as one block of "
                f"{settings.gen_length}; block_length {settings.block_length} does not apply to it"
            )
    configs = {m: settings.row_config(m) for m in settings.methods}
    T = {m: config.steps_per_block for m, config in configs.items()}
    own = {m: _summary(config) for m, config in configs.items()}
    if settings.warmup:  # every rank warms up on its own share
        first = encoded[tasks[0].name]
        _warm_up(lm, settings, [first[i] for i in world.shard(len(first))], log)
    return _Prepared(settings, lm, out, data_dir, tasks, chat, encoded, T, own)


def _load_model(settings: BenchConfig, world: World, device, log):
    from caidllm.models import load

    log(
        f"loading model {settings.model} ..." + (f" on {world.world_size} ranks" if world.distributed else "")
    )
    return load(
        settings.model,
        device=device,
        dtype=settings.dtype,
        compile=settings.compile,
        quantize=settings.quantize,
        quantize_head=settings.quantize_head,
    )


def _run_every_method(run: _Prepared, world: World, traces: dict, log) -> list[dict]:
    """Each task, each method on it: every rank decodes its share, rank 0 builds the row from all
    shares and sets the rows against the first method's. The rows (on rank 0; empty elsewhere)."""
    results = []
    for task in run.tasks:
        rows, encoded = [], run.encoded[task.name]
        for method in run.settings.methods:
            world.barrier()  # the ranks start each method together, so the slowest rank's wall is the run's
            with together(world):
                part = run_shard(run.lm, run.settings, task, method, encoded, world.shard(len(encoded)))
            parts: list[ShardRun] | None = world.gather(part)
            if world.is_main:
                rows.append(
                    build_row(
                        run.settings,
                        task,
                        method,
                        encoded,
                        parts,
                        run.out,
                        traces[method],
                        run.T[method],
                        log,
                        weights_mb(run.lm),
                    )
                )
        if world.is_main:
            relative(rows)
            results.extend(rows)
    return results


def _quiet(message: str) -> None:
    """Ranks other than 0 log nothing."""


# ---- setup ---------------------------------------------------------------------


def _prepare_out(out) -> Path | None:
    if out is None:
        return None
    path = Path(out).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".caidllm-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise InputError(f"cannot write to output directory {path}: {e.strerror or e}") from None
    return path


def _encode(lm, sample: Sample, chat: bool, gen_length: int) -> Encoded:
    from caidllm.decode.api import tokenize_prompts

    budget = lm.config.max_length - gen_length
    try:
        ids = tokenize_prompts(lm, [sample.prompt], chat)[0]
        truncated = False
        if len(ids) > budget and sample.context is not None:
            ids, truncated = _truncate_context(lm, sample, chat, budget, ids)
        if len(ids) > budget:
            return Encoded(
                sample,
                None,
                f"prompt of {len(ids)} tokens + gen_length {gen_length} exceeds the "
                f"model's context of {lm.config.max_length} tokens",
            )
        return Encoded(sample, ids, None, truncated)
    except CaidllmError as e:
        return Encoded(sample, None, str(e))


def _truncate_context(lm, sample: Sample, chat: bool, budget: int, ids: list[int]):
    """Cut the middle of the sample's context (LongBench style) until the
    prompt fits `budget` tokens."""
    from caidllm.decode.api import tokenize_prompts

    context_ids = lm.tokenizer.encode(sample.context, add_special_tokens=False)
    for _ in range(4):
        excess = len(ids) - budget
        if excess <= 0:
            return ids, True
        keep = len(context_ids) - excess - 16
        if keep <= 0:
            break
        context_ids = context_ids[: keep // 2] + context_ids[len(context_ids) - (keep - keep // 2) :]
        text = lm.tokenizer.decode(context_ids, skip_special_tokens=True)
        ids = tokenize_prompts(lm, [sample.render(text)], chat)[0]
    return ids, True


def _warm_up(lm, settings: BenchConfig, encoded: list[Encoded], log) -> None:
    batch = [e.ids for e in encoded if e.ids is not None][: settings.batch_size]
    if not batch:
        return
    log(f"warm-up: one batch of {len(batch)} per method")
    for method in settings.methods:
        lm.generate(batch, **settings.generate_options(method), batch_size=len(batch), chat=False)
    sync(lm)


def _summary(config) -> dict:
    """A row's own settings as the report records them ({owner: {field: value}})."""
    if isinstance(config, DiffusionGemmaSettings):
        return uniform_summary(config)
    if isinstance(config, SequentialSettings):
        return {config.method: dataclasses.asdict(config)}
    return settings_summary(config)


__all__ = ["BenchConfig", "run_bench", "DEFINITIONS", "CONFIDENCE_BUCKETS"]
