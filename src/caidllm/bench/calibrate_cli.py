"""`caidllm calibrate`: the command line of the settings search (calibrate_run.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from caidllm.bench.calibrate import OBJECTIVES, SEARCH_SPACE
from caidllm.bench.calibrate_kinds import UNIFORM_SPACE
from caidllm.bench.calibrate_run import CalibrateOptions, run_calibrate
from caidllm.options import add_quantize_arguments

EPILOG = (
    """\
held-out samples: the validation split of synthetic:<name> tasks; for file-based tasks (bbh:<name>, ...) the
slice --holdout START:END of the file (bench evaluates the first --limit examples: take a slice after them).
searched: """
    + ", ".join(SEARCH_SPACE)
    + """ (a cai preset, against vanilla);
a uniform-state model (DiffusionGemma, tiny-dg): diffusiongemma-cai's dgcai."""
    + ", dgcai.".join(UNIFORM_SPACE)
    + """, against the official sampler diffusiongemma,
every decode sampled with --seed.
examples:
  caidllm calibrate --model tiny --task synthetic:arithmetic --task synthetic:boolean_expressions \\
      --max-loss 1.0 --budget 20 --out runs/settings.json
  caidllm bench --model tiny --task synthetic:arithmetic --methods vanilla,cai --settings runs/settings.json
  caidllm calibrate --model tiny-dg --method diffusiongemma-cai --task synthetic:boolean_expressions \\
      --budget 8 --out runs/dg-settings.json
"""
)


def register(sub, name: str = "calibrate") -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help="search the CAI settings that are fastest within an accuracy loss of vanilla",
        description="Seeded coordinate search over CAI settings on held-out samples: the fastest "
        "(mean NFE, or wall time) whose accuracy is at least vanilla's (a uniform-state model: the "
        "official sampler diffusiongemma's) minus --max-loss points on the same samples. Writes a "
        "settings file (and a .md table beside it) for generate / bench / serve --settings.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="tiny", help="model folder (Hugging Face layout) or 'tiny' (default)")
    p.add_argument("--task", action="append", dest="tasks", metavar="TASK", default=None, help="repeatable")
    p.add_argument("--out", required=True, metavar="FILE", help="the settings file to write (JSON)")
    p.add_argument(
        "--method",
        default=None,
        help="the CAI preset to start from (default cai; a uniform-state model: diffusiongemma-cai, the "
        "only one it takes)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="the row name caidllm bench gives these settings (default cai-calibrated; dgcai-calibrated)",
    )
    p.add_argument(
        "--max-loss", type=float, default=1.0, help="accuracy points below vanilla allowed (default 1)"
    )
    p.add_argument("--budget", type=int, default=20, help="settings decoded, the start included (default 20)")
    p.add_argument("--objective", choices=OBJECTIVES, default="nfe", help="minimise NFE (default) or wall")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="orders the search and draws the synthetic samples; a uniform-state model's decodes' seed",
    )
    p.add_argument("--limit", type=int, default=32, help="held-out samples per synthetic task (default 32)")
    p.add_argument("--holdout", default=None, metavar="START:END", help="the slice of each file-based task")
    p.add_argument(
        "--gen-length", type=int, default=None, help="default: a known checkpoint's recommendation, else 256"
    )
    p.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="default: a known checkpoint's recommendation, else the method's (a block-diffusion "
        "model's own where the method's does not apply); a uniform-state model: not taken (its canvas)",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--data-dir", default=None, help="benchmark data folder (as caidllm bench)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    add_quantize_arguments(p)
    p.add_argument("--no-chat", action="store_true", help="raw prompts, without the chat template")
    progress = p.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_const", const=True, default=None)
    progress.add_argument("--no-progress", dest="progress", action="store_const", const=False)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from caidllm.bench.cli import resolve_data_dir

    tasks = args.tasks or []
    options = CalibrateOptions(
        tasks=tasks,
        out=args.out,
        model=args.model,
        method=args.method,
        name=args.name,
        max_loss=args.max_loss,
        budget=args.budget,
        objective=args.objective,
        seed=args.seed,
        limit=args.limit,
        holdout=args.holdout,
        gen_length=args.gen_length,
        block_length=args.block_length,
        batch_size=args.batch_size,
        data_dir=resolve_data_dir(args.data_dir, tasks),
        device=args.device,
        dtype=args.dtype,
        quantize=args.quantize,
        quantize_head=args.quantize_head,
        chat=not args.no_chat,
        progress=args.progress,
    )
    result = run_calibrate(options)
    print(result["table"])
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.md')}", file=sys.stderr)
    return 0
