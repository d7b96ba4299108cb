"""`caidllm train`: train (or resume) the tiny model, validate it, export it."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from caidllm.errors import InputError
from caidllm.train.config import OBJECTIVES, TrainConfig
from caidllm.train.trainer import Trainer
from caidllm.train.upcycle import upcycle


def register(sub, name: str) -> None:
    parser = sub.add_parser(name, help="train the tiny model on the synthetic tasks (resumable)")
    parser.add_argument("--out", default="runs/tiny", help="run folder: checkpoint.pt, train.log, tokenizer/")
    for f in fields(TrainConfig):
        if f.name in (
            "out_dir",
            "task_phases",
            "lr_restarts",
            "canvas_lengths",
            "objective",
            "block_lengths",
            "init_from",
        ):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool",) or isinstance(f.default, bool):
            parser.add_argument(
                flag, type=lambda v: v.lower() in ("1", "true", "yes"), default=None, metavar="BOOL"
            )
        elif f.name == "time_limit_s":
            parser.add_argument(flag, type=float, default=None)
        else:
            parser.add_argument(flag, type=type(f.default), default=None)
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        help="masked (default): LLaDA's SFT; block_diffusion: block-causal attention, each "
        "answer block noised on its own (the recipe of tiny-bd); uniform: a DiffusionGemma-architecture "
        "model, uniform-state noise over canvases (the recipe of tiny-dg)",
    )
    _add_start_and_shape_flags(parser)
    parser.add_argument(
        "--upcycle-from",
        metavar="MODEL",
        help="start from an MoE model in the LLaDA2 layout upcycled from this dense LLaDA-layout "
        "model (written once to OUT/upcycled; train/upcycle.py; the recipe of tiny-moe)",
    )
    parser.add_argument(
        "--task-mix",
        metavar="NAME=WEIGHT,...",
        help="one task mix for the whole run instead of the recipe's phases, e.g. "
        "dyck_languages=1 to probe a single task",
    )
    parser.add_argument("--export", metavar="DIR", help="after training, write the model in HF layout to DIR")
    parser.add_argument(
        "--validate-only", action="store_true", help="do not train: print validation accuracy"
    )
    parser.set_defaults(handler=run_train)


def _add_start_and_shape_flags(parser) -> None:
    parser.add_argument(
        "--block-lengths",
        metavar="N,N,...",
        help="block_diffusion: the block lengths to train on, one drawn per batch (default 4,8,16,32)",
    )
    parser.add_argument(
        "--canvas-lengths",
        metavar="N,N,...",
        help="the answer canvases a batch draws from (default 64,96,128,160,192,256; tiny-cot up to 512)",
    )
    parser.add_argument(
        "--init-from",
        metavar="MODEL",
        help="start from this model's weights (a folder or 'tiny') instead of random ones",
    )


def run_train(args) -> int:
    overrides = {
        f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name, None) is not None
    }
    if args.objective is not None:
        overrides["objective"] = args.objective
    if args.init_from is not None:
        overrides["init_from"] = args.init_from
    if args.upcycle_from is not None:
        if args.init_from is not None:
            raise InputError("--upcycle-from and --init-from both name a start; give one")
        overrides["init_from"] = str(upcycled_start(args.upcycle_from, Path(args.out)))
    if args.block_lengths is not None:
        overrides["block_lengths"] = parse_block_lengths(args.block_lengths)
    if args.canvas_lengths is not None:
        overrides["canvas_lengths"] = parse_block_lengths(args.canvas_lengths, "--canvas-lengths")
    if args.task_mix is not None:
        overrides["task_phases"] = ((0, parse_task_mix(args.task_mix)),)
    cfg = TrainConfig(out_dir=args.out, **overrides)
    trainer = Trainer(cfg)
    if args.validate_only:
        print(
            json.dumps(
                {"step": trainer.step, "facts": trainer.fact_accuracy(), "validation": trainer.validate()}
            )
        )
    else:
        trainer.train()
    if args.export:
        print(f"exported to {trainer.export(args.export)}")
    return 0


def parse_task_mix(text: str) -> dict[str, float]:
    """ "dyck_languages=2,navigate=1" -> {"dyck_languages": 2.0, "navigate": 1.0}
    (TrainConfig checks the names and weights)."""
    mix = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        try:
            value = float(weight)
        except ValueError:
            value = None
        if value is None or not name.strip():
            raise InputError(f"--task-mix: expected NAME=WEIGHT[,NAME=WEIGHT...], got {part!r} in {text!r}")
        mix[name.strip()] = value
    return mix


def parse_block_lengths(text: str, flag: str = "--block-lengths") -> tuple[int, ...]:
    """ "4,8,16" -> (4, 8, 16) (TrainConfig checks that each is >= 1)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"{flag}: expected integers separated by commas, got {text!r}") from None


def upcycled_start(source: str, out: Path) -> Path:
    """OUT/upcycled: `source` upcycled to LLaDA2 MoE, written on the run's first start only
    (a resumed run keeps the start it trained from)."""
    folder = out / "upcycled"
    if not (folder / "config.json").is_file():
        upcycle(source, folder)
    return folder
