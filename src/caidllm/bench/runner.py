"""The side-by-side benchmark: every method on the same examples, one process.

    from caidllm.bench import BenchSettings, run_bench
    results = run_bench(BenchSettings(model="tiny", tasks=["synthetic:arithmetic"],
                                      methods=["vanilla", "fastdllm", "cai"], limit=64, out="runs/bench"))

Order of work: check every setting and the output directory, load every
task (data errors surface before the model loads), load the model, tokenise
each prompt once (the same token ids go to every method), one warm-up batch
per method, then for each task and each method: reset the peak-memory
counter, start the energy meter, decode all examples batch by batch (only
the `generate` calls are timed; scoring comes after the clock stops), stop
the meters, score every sample (a scorer crash is recorded for that sample
and the run goes on).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from caidllm.bench.measure import EnergyMeter, MemoryMeter
from caidllm.bench.metrics import mean, stderr
from caidllm.bench.sandbox import Limits, isolation_summary
from caidllm.bench.tasks import BenchTask, Sample, Scored, load_task
from caidllm.decode.presets import build_config, method_names
from caidllm.errors import CaidllmError, InputError

CONFIDENCE_BUCKETS = (">0.50", "0.25-0.50", "<0.25")  # the paper's Figure 1c classes of s_i = c_i(0)

DEFINITIONS = {
    "accuracy": "mean per-sample score (exact match / pass@1: 0 or 1; LongBench: F1 or ROUGE-L in [0, 1]); "
                "samples that failed to generate or score count as 0",
    "stderr": "standard error of the mean, sample std / sqrt(n) (= sqrt(p(1-p)/(n-1)) for 0/1 scores), as lm-eval",
    "nfe_mean": "forward passes per request, mean over the task's requests",
    "steps_per_block": "denoising steps per block index, mean over requests (0 for blocks skipped by early stop)",
    "steps_per_block_decoded": "the same, over the requests that decoded that block",
    "wall_s": "wall-clock seconds of the generate() calls of this method on this task, after a warm-up; "
              "tokenisation of the prompts and scoring are outside the clock",
    "tps_positions": "generated positions per second: n * gen_length / wall_s (prompt never counted)",
    "tps_answer": "answer tokens per second: sum of answer lengths (up to the first end token) / wall_s",
    "speedup": "wall_s of the first method listed / wall_s of this method, same task, same examples",
    "nfe_ratio": "nfe_mean of the first method listed / nfe_mean of this method",
    "peak_mem_mb": "CUDA: torch.cuda.max_memory_allocated, reset before each method; CPU: the process's peak RSS "
                   "so far (getrusage; monotone, not per method)",
    "energy_j": "GPU: NVML energy counter (or sampled power integrated) during the method's generate() calls; "
                "CPU: RAPL package energy; null when not measurable",
    "controller_share": "time in the commit policy (controller_s) / wall time, summed over batches",
    "flops_share": "share of layer-token work computed (ES-dLLM style backends report it); null when not reported",
}


@dataclass
class BenchSettings:
    model: str = "tiny"
    tasks: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=lambda: ["vanilla", "fastdllm", "cai"])
    limit: int | None = None
    batch_size: int = 8
    gen_length: int = 256
    block_length: int = 64
    data_dir: str | None = None
    out: str | None = None
    device: str | None = None
    dtype: str | None = None
    early_stop: bool = True
    seed: int = 0
    temperature: float = 0.0
    fewshot: int = 0
    chat: bool = True
    warmup: bool = True
    progress: bool | None = None  # None: only when stderr is a terminal
    code_timeout: float = 10.0
    # A settings file (caidllm calibrate): its values run as one more method row, named by the file
    # ("cai-calibrated"), beside the presets listed (appended if --methods does not name it).
    settings_file: str | None = None
    _loaded: object = field(default=None, init=False, repr=False, compare=False)

    def loaded_settings(self):
        if self.settings_file is not None and self._loaded is None:
            from caidllm.decode.settings_file import load_settings

            self._loaded = load_settings(self.settings_file)
        return self._loaded

    def method_options(self, method: str) -> tuple[str, dict]:
        """(preset, extra generate() keywords) of a method row."""
        loaded = self.loaded_settings()
        if loaded is not None and method == loaded.name:
            return loaded.method, {"settings": loaded}
        return method, {}

    def check(self) -> None:
        if not self.tasks:
            raise InputError("no task given; pass --task at least once (e.g. --task synthetic:arithmetic)")
        if not self.methods:
            raise InputError(f"no method given; choose from {', '.join(method_names())}")
        known = method_names()
        loaded = self.loaded_settings()
        if loaded is not None:
            if loaded.name in known:
                raise InputError(f"settings file {self.settings_file}: its name {loaded.name!r} is a preset's; "
                                 "give it another \"name\"")
            if loaded.name not in self.methods:
                self.methods = [*self.methods, loaded.name]
            known = [*known, loaded.name]
        for m in self.methods:
            if m not in known:
                raise InputError(f"unknown method {m!r}; choose from {', '.join(known)}")
        if len(set(self.methods)) != len(self.methods):
            raise InputError(f"methods listed twice in {','.join(self.methods)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise InputError(f"tasks listed twice in {', '.join(self.tasks)}")
        for name in ("limit", "batch_size", "gen_length", "block_length"):
            value = getattr(self, name)
            if name == "limit" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if isinstance(self.fewshot, bool) or not isinstance(self.fewshot, int) or self.fewshot < 0:
            raise InputError(f"fewshot must be an integer >= 0, got {self.fewshot!r}")
        if not (isinstance(self.code_timeout, (int, float)) and self.code_timeout > 0):
            raise InputError(f"code-timeout must be a positive number of seconds, got {self.code_timeout!r}")
        for m in self.methods:  # gen/block lengths and temperature checked by the decoder's own validation
            preset, extra = self.method_options(m)
            build_config(preset, **extra, gen_length=self.gen_length, block_length=self.block_length,
                         temperature=self.temperature, early_stop=self.early_stop)


@dataclass
class _Encoded:
    sample: Sample
    ids: list[int] | None
    error: str | None = None
    truncated: bool = False


# ---- entry point -------------------------------------------------------------


def run_bench(settings: BenchSettings, lm=None, log=None) -> dict:
    """Run the benchmark; returns the results object (also written to
    settings.out when given). `lm`: an already loaded DiffusionLM to use
    instead of loading settings.model."""
    log = log or (lambda message: print(message, file=sys.stderr))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    settings.check()
    out = _prepare_out(settings.out)
    data_dir = Path(settings.data_dir).expanduser() if settings.data_dir else None
    limits = Limits(timeout_s=float(settings.code_timeout))
    tasks = [load_task(spec, data_dir=data_dir, limit=settings.limit, fewshot=settings.fewshot,
                       seed=settings.seed, code_limits=limits) for spec in settings.tasks]
    _check_not_calibrated_on(settings, tasks)

    if lm is None:
        from caidllm.models import load

        log(f"loading model {settings.model} ...")
        lm = load(settings.model, device=settings.device, dtype=settings.dtype)
    torch.manual_seed(settings.seed)
    chat = settings.chat and bool(getattr(lm.tokenizer, "chat_template", None))
    encoded = {t.name: [_encode(lm, s, chat, settings.gen_length) for s in t.samples] for t in tasks}
    T = {m: build_config(settings.method_options(m)[0], **settings.method_options(m)[1],
                         gen_length=settings.gen_length, block_length=settings.block_length).steps_per_block
         for m in settings.methods}

    if settings.warmup:
        _warm_up(lm, settings, encoded[tasks[0].name], log)

    results, traces = [], {m: {"buckets": {b: [] for b in CONFIDENCE_BUCKETS}, "steps": []} for m in settings.methods}
    for task in tasks:
        rows = []
        for method in settings.methods:
            row = _run_one(lm, settings, task, method, encoded[task.name], out, traces[method], T[method], log)
            rows.append(row)
        _relative(rows)
        results.extend(rows)

    report = {
        "settings": {**_settings_dict(settings, lm, tasks, data_dir, chat, T), "started": started},
        "definitions": DEFINITIONS,
        "results": results,
    }
    if out is not None:
        from caidllm.bench import plots, report as report_mod

        report["plots"] = plots.write_all(out, report, traces, T)
        report_mod.write(out, report)
    return report


# ---- setup ---------------------------------------------------------------------


def _check_not_calibrated_on(settings: BenchSettings, tasks: list[BenchTask]) -> None:
    """A settings file's held-out samples must not be evaluated: that would grade it on its own training set."""
    loaded = settings.loaded_settings()
    for task in tasks if loaded is not None else ():
        seen = loaded.held_out_ids(task.name)
        overlap = [s.id for s in task.samples if s.id in seen]
        if overlap:
            raise InputError(f"settings file {settings.settings_file} was calibrated on {len(overlap)} of the "
                             f"samples of {task.name} evaluated here (first: {overlap[0]}); evaluate other samples "
                             "(e.g. a smaller --limit) or calibrate on a disjoint slice")


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


def _encode(lm, sample: Sample, chat: bool, gen_length: int) -> _Encoded:
    from caidllm.decode.api import tokenize_prompts

    budget = lm.config.max_length - gen_length
    try:
        ids = tokenize_prompts(lm, [sample.prompt], chat)[0]
        truncated = False
        if len(ids) > budget and sample.context is not None:
            ids, truncated = _truncate_context(lm, sample, chat, budget, ids)
        if len(ids) > budget:
            return _Encoded(sample, None, f"prompt of {len(ids)} tokens + gen_length {gen_length} exceeds the "
                                          f"model's context of {lm.config.max_length} tokens")
        return _Encoded(sample, ids, None, truncated)
    except CaidllmError as e:
        return _Encoded(sample, None, str(e))


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
        context_ids = context_ids[:keep // 2] + context_ids[len(context_ids) - (keep - keep // 2):]
        text = lm.tokenizer.decode(context_ids, skip_special_tokens=True)
        ids = tokenize_prompts(lm, [sample.render(text)], chat)[0]
    return ids, True


def _warm_up(lm, settings: BenchSettings, encoded: list[_Encoded], log) -> None:
    batch = [e.ids for e in encoded if e.ids is not None][:settings.batch_size]
    if not batch:
        return
    log(f"warm-up: one batch of {len(batch)} per method")
    for method in settings.methods:
        preset, extra = settings.method_options(method)
        lm.generate(batch, method=preset, **extra, gen_length=settings.gen_length, block_length=settings.block_length,
                    temperature=settings.temperature, seed=settings.seed, early_stop=settings.early_stop,
                    batch_size=len(batch), chat=False)
    _sync(lm)


def _sync(lm) -> None:
    if torch.device(lm.device).type == "cuda":
        torch.cuda.synchronize(lm.device)


# ---- one task x one method ----------------------------------------------------


def _run_one(lm, settings: BenchSettings, task: BenchTask, method: str, encoded: list[_Encoded], out: Path | None,
             trace_store: dict, T: int, log) -> dict:
    todo = [i for i, e in enumerate(encoded) if e.ids is not None]
    batches = [todo[i:i + settings.batch_size] for i in range(0, len(todo), settings.batch_size)]
    generations: dict[int, object] = {}
    errors: dict[int, str] = {i: e.error for i, e in enumerate(encoded) if e.error}
    memory, energy = MemoryMeter(lm.device), EnergyMeter(lm.device)
    wall = controller = engine = 0.0
    progress = _progress(len(todo), f"{task.name} {method}", settings.progress)

    memory.reset()
    energy.start()
    for batch in batches:
        _sync(lm)
        started = time.perf_counter()
        try:
            preset, extra = settings.method_options(method)
            out_batch = lm.generate([encoded[i].ids for i in batch], method=preset, **extra,
                                    gen_length=settings.gen_length,
                                    block_length=settings.block_length, temperature=settings.temperature,
                                    seed=settings.seed, early_stop=settings.early_stop, batch_size=len(batch),
                                    chat=False)
        except CaidllmError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: record for these samples, go on
            _sync(lm)
            wall += time.perf_counter() - started
            for i in batch:
                errors[i] = f"generation failed: {type(e).__name__}: {e}"
            progress.update(len(batch))
            continue
        _sync(lm)
        wall += time.perf_counter() - started
        controller += out_batch[0].controller_s
        engine += out_batch[0].elapsed_s
        for i, result in zip(batch, out_batch):
            generations[i] = result
        progress.update(len(batch))
    reading = energy.stop()
    peak = memory.peak_mb()
    progress.close()

    records, scores, extras = [], [], {k: [] for k in task.extra_metrics}
    for i, enc in enumerate(encoded):
        result = generations.get(i)
        text = result.text if result is not None else ""
        scored, error = _score(task, text, enc.sample) if result is not None else (None, errors.get(i))
        score = scored.score if scored is not None else 0.0
        scores.append(score)
        for k in extras:
            extras[k].append(float(scored.details.get(k, 0.0)) if scored is not None else 0.0)
        records.append(_record(task, method, enc, result, scored, score, error))
        if result is not None:
            _collect_trace(result, trace_store)

    done = [generations[i] for i in sorted(generations)]
    n_blocks = settings.gen_length // settings.block_length
    steps = [r.steps_per_block for r in done]
    spb = [mean(s[b] for s in steps) for b in range(n_blocks)] if steps else [None] * n_blocks
    decoded = [mean(s[b] for s in steps if s[b] > 0) for b in range(n_blocks)]
    fractions = [getattr(r, "computed_fraction", None) for r in done]
    fractions = [f for f in fractions if f is not None]
    answer_tokens = sum(r.answer_length for r in done)
    accuracy = mean(scores)
    row = {
        "task": task.name,
        "method": method,
        "metric": task.metric,
        "n": len(encoded),
        "n_generated": len(done),
        "accuracy": accuracy,
        "stderr": stderr(scores),
        "nfe_mean": mean(r.nfe for r in done),
        "steps_per_block": spb,
        "steps_per_block_decoded": decoded,
        "steps_per_block_max": T,
        "steps_saved_per_block": [None if d is None else T - d for d in decoded],
        "wall_s": wall,
        "engine_s": engine,
        "tps_positions": len(done) * settings.gen_length / wall if wall > 0 else None,
        "tps_answer": answer_tokens / wall if wall > 0 else None,
        "answer_tokens": answer_tokens,
        "speedup": None,
        "nfe_ratio": None,
        "peak_mem_mb": peak,
        "peak_mem_kind": memory.kind,
        "energy_j": reading.joules,
        "energy_source": reading.source,
        "energy_note": reading.note,
        "avg_power_w": reading.avg_power_w,
        "controller_s": controller,
        "controller_share": controller / wall if wall > 0 else None,
        "flops_share": mean(fractions) if fractions else None,
        "early_stopped": mean(float(r.early_stopped) for r in done),
        "errors": sum(1 for r in records if r["error"]),
        "fewshot": task.fewshot,
        "confidence_buckets": _bucket_summary(done),
        "samples": None,
    }
    for k, values in extras.items():
        row[f"accuracy_{k}"] = mean(values)
        row[f"stderr_{k}"] = stderr(values)
    if out is not None:
        path = out / f"samples_{_slug(task.name)}_{_slug(method)}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        row["samples"] = path.name
    shown = "n/a" if accuracy is None else f"{accuracy:.3f}"
    log(f"{task.name} {method}: score {shown}, NFE {row['nfe_mean']}, wall {wall:.2f} s, errors {row['errors']}")
    return row


def _score(task: BenchTask, text: str, sample: Sample) -> tuple[Scored | None, str | None]:
    try:
        scored = task.score(text, sample)
    except Exception as e:  # noqa: BLE001 - one sample's scorer crash must not end the run
        return None, f"scoring failed: {type(e).__name__}: {e}"
    return scored, None


def _record(task, method, enc: _Encoded, result, scored: Scored | None, score: float, error: str | None) -> dict:
    return {
        "id": enc.sample.id,
        "task": task.name,
        "method": method,
        "prompt": enc.sample.prompt if enc.sample.context is None else enc.sample.render("<context>"),
        "prompt_tokens": None if enc.ids is None else len(enc.ids),
        "prompt_truncated": enc.truncated,
        "generated": None if result is None else result.text,
        "extracted": None if scored is None else scored.extracted,
        "score": score,
        "correct": bool(scored is not None and scored.correct),
        "nfe": None if result is None else result.nfe,
        "answer_length": None if result is None else result.answer_length,
        "steps_per_block": None if result is None else result.steps_per_block,
        "early_stopped": None if result is None else result.early_stopped,
        "details": None if scored is None else scored.details,
        "error": error,
    }


def _bucket_of(confidence: float) -> str:
    return ">0.50" if confidence > 0.50 else "<0.25" if confidence < 0.25 else "0.25-0.50"


def _collect_trace(result, store: dict) -> None:
    store["steps"].append(list(result.steps_per_block))
    trace = result.trace
    for confidence, step in zip(trace.first_confidence, trace.commit_step_in_block):
        if confidence is None or step < 0 or (isinstance(confidence, float) and math.isnan(confidence)):
            continue
        store["buckets"][_bucket_of(confidence)].append(step)


def _bucket_summary(done) -> dict:
    store = {"buckets": {b: [] for b in CONFIDENCE_BUCKETS}, "steps": []}
    for r in done:
        _collect_trace(r, store)
    return {b: {"tokens": len(v), "mean_commit_step": mean(v)} for b, v in store["buckets"].items()}


def _relative(rows: list[dict]) -> None:
    first = rows[0]
    for row in rows:
        if first["wall_s"] and row["wall_s"]:
            row["speedup"] = first["wall_s"] / row["wall_s"]
        if first["nfe_mean"] and row["nfe_mean"]:
            row["nfe_ratio"] = first["nfe_mean"] / row["nfe_mean"]


def _progress(total: int, desc: str, enabled: bool | None):
    from tqdm import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, disable=disable, leave=False)


def _slug(name: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)
    return keep.strip("-") or "task"


def _settings_dict(s: BenchSettings, lm, tasks: list[BenchTask], data_dir, chat: bool, T: dict) -> dict:
    device = torch.device(lm.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    from importlib.metadata import PackageNotFoundError, version

    try:
        caidllm_version = version("caidllm")
    except PackageNotFoundError:
        caidllm_version = None
    return {
        "model": s.model,
        "model_path": str(lm.path) if getattr(lm, "path", None) else None,
        "family": lm.config.family,
        "device": str(device),
        "gpu": gpu,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "tasks": [t.name for t in tasks],
        "task_sources": {t.name: t.source for t in tasks},
        "task_metrics": {t.name: t.metric for t in tasks},
        "task_notes": {t.name: t.notes for t in tasks if t.notes},
        "methods": list(s.methods),
        "baseline": s.methods[0],
        "settings_file": s.loaded_settings().summary() if s.settings_file else None,
        "limit": s.limit,
        "n": {t.name: len(t.samples) for t in tasks},
        "batch_size": s.batch_size,
        "gen_length": s.gen_length,
        "block_length": s.block_length,
        "steps_per_block_max": T,
        "early_stop": s.early_stop,
        "temperature": s.temperature,
        "seed": s.seed,
        "chat_template": chat,
        "fewshot": s.fewshot,
        "prompting": {t.name: (f"{t.fewshot}-shot" if t.fewshot else "zero-shot") for t in tasks},
        "data_dir": str(data_dir) if data_dir else None,
        "warmup": "one batch per method before timing" if s.warmup else "none",
        "code_execution": {"timeout_s": s.code_timeout, "isolation": isolation_summary()}
        if any(t.metric == "pass@1" for t in tasks) else None,
        "torch": torch.__version__,
        "caidllm": caidllm_version,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


__all__ = ["BenchSettings", "run_bench", "DEFINITIONS", "CONFIDENCE_BUCKETS"]
