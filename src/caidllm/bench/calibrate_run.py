"""`caidllm calibrate`: held-out samples, their decodes, the settings file and its table.

    from caidllm.bench.calibrate_run import CalibrateOptions, run_calibrate
    result = run_calibrate(CalibrateOptions(tasks=["synthetic:arithmetic"], out="runs/settings.json"))

Held-out samples: the validation split of `synthetic:` tasks (the benchmark
evaluates the test split), and for file-based tasks the slice START:END of
the file given by `holdout` (the benchmark evaluates the first --limit
examples: take a slice after them). Their ids go in the settings file, and
`caidllm bench --settings` refuses to evaluate any of them.

What is searched depends on the model's kind (calibrate_kinds.py): a mask-based model's CAI preset
against vanilla, a uniform-state model's diffusiongemma-cai against the official sampler diffusiongemma.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from caidllm.bench.calibrate import OBJECTIVES, Trial, choose, coordinate_search, floor_of
from caidllm.bench.calibrate_kinds import MASK, CalibrationKind, calibration_kind
from caidllm.bench.metrics import mean
from caidllm.bench.tasks import BenchTask, kind_of, load_task
from caidllm.decode.settings_file import CalibratedSettings, write_settings
from caidllm.errors import InputError
from caidllm.options import lengths_for_run


@dataclass
class CalibrateOptions:
    tasks: list[str] = field(default_factory=list)
    out: str | None = None  # the settings file to write (a .md table goes beside it)
    model: str = "tiny"
    method: str | None = None  # the preset searched from (None: the model kind's, cai or diffusiongemma-cai)
    name: str | None = None  # the row name bench gives the result (None: cai- or dgcai-calibrated)
    max_loss: float = 1.0  # accuracy points below the baseline (vanilla, or diffusiongemma) allowed
    budget: int = 20  # settings decoded (the start included); the baseline is one more decode
    objective: str = "nfe"
    seed: int = 0  # orders the search, draws the samples; a uniform-state model: every decode's seed
    limit: int = 32  # held-out samples per synthetic task
    holdout: str | None = None  # START:END of every file-based task
    gen_length: int | None = None  # None: as generate takes them for the method (options.lengths_for_run)
    block_length: int | None = None
    batch_size: int = 8
    data_dir: str | None = None
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None  # torchao quantized linear layers: the settings are calibrated for that model
    quantize_head: bool = False
    chat: bool = True
    progress: bool | None = None

    def check(self) -> None:
        if not self.tasks:
            raise InputError("no task given; pass --task at least once (e.g. --task synthetic:arithmetic)")
        for spec in self.tasks:
            kind_of(spec)
        if len(set(self.tasks)) != len(self.tasks):
            raise InputError(f"tasks listed twice in {', '.join(self.tasks)}")
        if not self.out:
            raise InputError("--out FILE is required: where to write the settings")
        for name in ("method", "name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InputError(f"{name} must be a non-empty string, got {value!r}", name)
        if self.objective not in OBJECTIVES:
            raise InputError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        for name in ("budget", "limit", "batch_size", "gen_length", "block_length"):
            value = getattr(self, name)
            if value is None and name.endswith("_length"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        loss = self.max_loss
        if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss <= 100:
            raise InputError(
                f"max-loss must be a number of accuracy points in [0, 100], got {self.max_loss!r}"
            )
        if any(kind_of(t) != "synthetic" for t in self.tasks):
            parse_slice(self.holdout)

    def for_kind(self, kind: CalibrationKind, family: str) -> CalibrateOptions:
        """These options with the kind's defaults for method and name, the method checked against it."""
        options = dataclasses.replace(
            self, method=self.method or kind.default_method, name=self.name or kind.default_name
        )
        kind.check(options, family)
        return options


def parse_slice(text: str | None) -> tuple[int, int]:
    """'200:250' -> (200, 250)."""
    if text is None:
        raise InputError(
            "file-based tasks need --holdout START:END, a slice of the file kept for calibration "
            "(the benchmark evaluates the first --limit examples: take one after them, e.g. 200:250)"
        )
    start, sep, end = str(text).partition(":")
    if not (sep and start.strip().isdigit() and end.strip().isdigit() and int(start) < int(end)):
        raise InputError(f"--holdout must be START:END with 0 <= START < END, got {text!r}")
    return int(start), int(end)


def held_out_tasks(options: CalibrateOptions) -> list[BenchTask]:
    from caidllm.bench.tasks import synthetic

    data_dir = Path(options.data_dir).expanduser() if options.data_dir else None
    tasks = []
    for spec in options.tasks:
        if kind_of(spec) == "synthetic":
            tasks.append(
                synthetic.load(spec.partition(":")[2], options.limit, options.seed, split="validation")
            )
            continue
        start, end = parse_slice(options.holdout)
        task = load_task(spec, data_dir=data_dir, limit=None, fewshot=0, seed=options.seed)
        if start >= len(task.samples):
            raise InputError(f"--holdout {options.holdout}: {spec} has only {len(task.samples)} examples")
        task.samples = task.samples[start:end]
        task.source = f"{task.source} [{start}:{start + len(task.samples)}]"
        tasks.append(task)
    return tasks


def run_calibrate(options: CalibrateOptions, lm=None, log=None) -> dict:
    """Search, write the settings file and its table; returns {"settings", "trials", "chosen", "table"}."""
    log = log or (lambda message: print(message, file=sys.stderr))
    options.check()
    kind, family = calibration_kind(options.model, lm)  # from config.json alone when lm is None
    options = options.for_kind(kind, family)
    tasks = held_out_tasks(options)
    # Unset lengths as generate takes them (a uniform-state model: gen_length one canvas, block_length the
    # canvas); the method and the baseline checked against the model (its config.json alone when it is
    # not loaded yet: a bad setting fails before loading).
    options = dataclasses.replace(
        options,
        **lengths_for_run(
            options.model,
            lm,
            [(options.method, {}), (kind.baseline, {})],
            options.gen_length,
            options.block_length,
        ),
    )
    lm = lm if lm is not None else _load_model(options, log)
    encoded = {t.name: _encode(lm, t, options) for t in tasks}
    evaluate = _evaluator(lm, options, tasks, encoded, kind)
    progress = _progress(options.budget + 1, options.progress)
    vanilla = evaluate(kind.baseline, {}, method=kind.baseline)
    progress.update(1)
    floor = floor_of(vanilla.accuracy, options.max_loss)
    vanilla.feasible = True

    def on_trial(trial: Trial) -> None:
        progress.update(1)
        progress.set_postfix(acc=f"{100 * trial.accuracy:.1f}", nfe=f"{trial.nfe:.1f}")

    trials = coordinate_search(
        kind.start(lm, options.method),
        evaluate,
        options.budget,
        floor,
        options.objective,
        options.seed,
        on_trial,
        space=kind.space,
        switches=kind.switches,
    )
    progress.close()
    chosen = choose(trials, floor, options.objective)
    settings = CalibratedSettings(
        method=options.method,
        name=options.name,
        values={kind.owner: dict(chosen.values)},
        calibration=_calibration(options, tasks, vanilla, trials, chosen, floor, kind),
    )
    table = markdown_table(vanilla, trials, chosen, floor, options, kind)
    _write(options.out, settings, table)
    return {"settings": settings, "trials": trials, "chosen": chosen, "vanilla": vanilla, "table": table}


def _load_model(options: CalibrateOptions, log):
    from caidllm.models import load

    log(f"loading model {options.model} ...")
    return load(
        options.model,
        device=options.device,
        dtype=options.dtype,
        quantize=options.quantize,
        quantize_head=options.quantize_head,
    )


def _write(out: str, settings: CalibratedSettings, table: str) -> None:
    """The settings file and, beside it (.md), the table of the trials."""
    write_settings(out, settings)
    Path(out).expanduser().with_suffix(".md").write_text(table + "\n", encoding="utf-8")


def start_values(lm, method: str) -> dict:
    """The preset's values of the searched settings (gating resolved to the model's default)."""
    return MASK.start(lm, method)


def _encode(lm, task: BenchTask, options: CalibrateOptions) -> list[list[int]]:
    from caidllm.decode.api import tokenize_prompts

    chat = options.chat and bool(getattr(lm.tokenizer, "chat_template", None))
    ids = tokenize_prompts(lm, [s.prompt for s in task.samples], chat)
    for sample, prompt in zip(task.samples, ids):
        if len(prompt) + options.gen_length > lm.config.max_length:
            raise InputError(
                f"{sample.id}: prompt of {len(prompt)} tokens + gen_length {options.gen_length} "
                f"exceeds the model's context of {lm.config.max_length} tokens"
            )
    return ids


def _evaluator(lm, options: CalibrateOptions, tasks: list[BenchTask], encoded: dict, kind=MASK):
    def evaluate(label: str, values: dict, method: str = options.method) -> Trial:
        per_task, nfes, wall = {}, [], 0.0
        for task in tasks:
            started = time.perf_counter()
            results = lm.generate(
                encoded[task.name],
                method=method,
                batch_size=options.batch_size,
                chat=False,
                **kind.decode_options(options),
                **(kind.wrap(values) if values else {}),
            )
            wall += time.perf_counter() - started
            per_task[task.name] = mean(_score(task, r.text, s) for r, s in zip(results, task.samples))
            nfes += [r.nfe for r in results]
        return Trial(
            label,
            dict(values),
            accuracy=mean(per_task.values()),
            nfe=mean(nfes),
            wall_s=wall,
            per_task=per_task,
        )

    return evaluate


def _score(task: BenchTask, text: str, sample) -> float:
    try:
        return task.score(text, sample).score
    except Exception:  # noqa: BLE001 - a scorer crash counts as wrong, as in the benchmark
        return 0.0


def _trial_dict(t: Trial) -> dict:
    return {
        "label": t.label,
        "values": {k: list(v) if isinstance(v, tuple) else v for k, v in t.values.items()},
        "accuracy": t.accuracy,
        "per_task": t.per_task,
        "nfe": t.nfe,
        "wall_s": t.wall_s,
        "feasible": t.feasible,
        "kept": t.kept,
    }


def _calibration(
    options, tasks, vanilla: Trial, trials: list[Trial], chosen: Trial, floor: float, kind=MASK
) -> dict:
    seeded = (
        f"; every decode (the baseline's and each trial's) sampled with seed {options.seed}"
        if kind.seeded
        else ""
    )
    if kind.block_name != "block_length":
        seeded += f"; block_length: the {kind.block_name}"
    return {
        "model": options.model,
        "quantization": options.quantize,
        "tasks": [t.name for t in tasks],
        "objective": options.objective,
        "max_loss_points": options.max_loss,
        "budget": options.budget,
        "seed": options.seed,
        "gen_length": options.gen_length,
        "block_length": options.block_length,
        "batch_size": options.batch_size,
        "held_out": {t.name: {"source": t.source, "ids": [s.id for s in t.samples]} for t in tasks},
        "baseline_method": kind.baseline,  # the floor is its accuracy minus max_loss_points
        "accuracy_floor": floor,
        "meets_floor": chosen.feasible,
        kind.baseline_key: _trial_dict(vanilla),
        "start": _trial_dict(trials[0]),
        "chosen": _trial_dict(chosen),
        "search": [_trial_dict(t) for t in trials],
        "note": "accuracy: mean over tasks of each task's mean score; nfe: per request; wall_s is "
        f"provisional (it depends on the machine's load); the floor: {kind.baseline_title}'s accuracy "
        f"minus max_loss_points{seeded}",
    }


def markdown_table(
    vanilla: Trial, trials: list[Trial], chosen: Trial, floor: float, options, kind=MASK
) -> str:
    names = list(vanilla.per_task)
    header = ["#", "trial", "accuracy %", *names, "NFE", "wall s (provisional)", "meets floor", "kept"]
    lines = [
        f"Calibration of `{options.method}` on {', '.join(names)}: objective {options.objective}, "
        f"floor {100 * floor:.2f}% ({kind.baseline_title} {100 * vanilla.accuracy:.2f}% - "
        f"{options.max_loss} points), budget {options.budget}, seed {options.seed}"
        f"{' (every decode)' if kind.seeded else ''}, gen_length {options.gen_length}, "
        f"{kind.block_name} {options.block_length}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for i, t in enumerate([vanilla, *trials]):
        mark = "**" if t is chosen else ""
        cells = [
            str(i),
            f"{mark}{t.label}{mark}",
            f"{100 * t.accuracy:.2f}",
            *(f"{100 * t.per_task[n]:.1f}" for n in names),
            f"{t.nfe:.2f}",
            f"{t.wall_s:.2f}",
            "yes" if t.feasible else "no",
            "" if t is vanilla else ("yes" if t.kept else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    start = trials[0]
    verdict = (
        "meets the floor" if chosen.feasible else "does NOT meet the floor (the most accurate trial is kept)"
    )
    changed = {k: v for k, v in chosen.values.items() if start.values.get(k) != v}
    lines += [
        "",
        f"Chosen: {chosen.label} ({verdict}); NFE {chosen.nfe:.2f} against {start.nfe:.2f} at the start "
        f"and {vanilla.nfe:.2f} for {kind.baseline}; changed from the start: "
        f"{', '.join(f'{k}={v}' for k, v in changed.items()) or 'nothing'}.",
    ]
    return "\n".join(lines)


def _progress(total: int, enabled: bool | None):
    from tqdm import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, desc="calibrate", unit="decode", file=sys.stderr, disable=disable, leave=False)
