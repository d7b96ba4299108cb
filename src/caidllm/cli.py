"""Command line: `caidllm generate`, `train`, `bench`, `calibrate`, `serve`, `loadtest`, `models`.

A thin front end over the public API. Bad input prints one line naming the
problem and exits with status 2; any other failure exits non-zero too.
"""

from __future__ import annotations

import argparse
import json
import sys

from caidllm.bench.calibrate_cli import register as register_calibrate
from caidllm.bench.cli import register as register_bench
from caidllm.decode.config import CACHE_MODES
from caidllm.decode.methods import method_names
from caidllm.decode.prefix_reuse import check_budget
from caidllm.errors import CaidllmError, InputError
from caidllm.models.checkpoints import recommended_method
from caidllm.models_cli import register as register_models
from caidllm.options import add_model_arguments, add_tp_argument, check_before_load, set_values
from caidllm.serve.cli import register as register_serve
from caidllm.serve.loadtest import register as register_loadtest
from caidllm.train.cli import register as register_train


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    known = " (default: a known checkpoint's recommendation, caidllm models lists them; else {})"
    parser.add_argument("--gen-length", type=int, default=None, help="answer tokens" + known.format(256))
    parser.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="tokens per block" + known.format(64) + "; elastic: one block of gen-length, none given",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="total steps over the generation" + known.format("gen-length")
    )
    parser.add_argument("--cache", choices=CACHE_MODES, default=None, help="override the method's cache mode")
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument(
        "--editing-threshold",
        type=float,
        default=None,
        help="LLaDA2.1 token editing: rewrite a committed token whose prediction changed with "
        "confidence above this (block-diffusion models)",
    )
    parser.add_argument(
        "--max-post-steps", type=int, default=None, help="token editing: steps after a block's last mask"
    )
    parser.add_argument(
        "--sub-block",
        type=int,
        default=None,
        help="Fast-dLLM v2: sub-block length inside a block (must divide --block-length; default 8)",
    )
    parser.add_argument(
        "--minimal-topk", type=int, default=None, help="LLaDA2: steps per block <= gen-length // this"
    )
    parser.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature" + known.format(0)
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        dest="set_values",
        help="any method's setting, by OWNER.FIELD (eb.gamma=0.02) or its flat name (eb_gamma=0.02); "
        "the VALUE is read as JSON, else as text; repeatable (caidllm models lists them all)",
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--no-early-stop", action="store_true", help="decode every block even after the answer ended"
    )


def add_prompt_and_output_arguments(gen: argparse.ArgumentParser) -> None:
    """generate's chat template choice and what it prints."""
    chat = gen.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat",
        dest="chat",
        action="store_const",
        const=True,
        default=None,
        help="put the prompt through the chat template (default for instruct models)",
    )
    chat.add_argument(
        "--no-chat",
        dest="chat",
        action="store_const",
        const=False,
        help="use the prompt as raw text, without the chat template (default for base models)",
    )
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    gen.add_argument(
        "--verbose",
        action="store_true",
        help="print the whole steps-per-block list under each answer (--json always has it)",
    )


def add_constraint_arguments(gen: argparse.ArgumentParser) -> None:
    """generate's structured-output flags (docs/structured-output.md): one at most."""
    structured = gen.add_mutually_exclusive_group()  # docs/structured-output.md
    structured.add_argument(
        "--json-schema",
        default=None,
        metavar="FILE",
        help="hold every answer to this JSON schema (a file), in any commit order",
    )
    structured.add_argument("--regex", default=None, help="hold every answer to this regular expression")
    structured.add_argument(
        "--choice", nargs="+", default=None, metavar="TEXT", help="the answer is one of these"
    )
    structured.add_argument("--json-object", action="store_true", help="the answer is a JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="caidllm", description="Fast decoding for masked diffusion language models"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    register_generate(sub, "generate")
    register_train(sub, "train")
    register_bench(sub, "bench")
    register_calibrate(sub, "calibrate")
    register_serve(sub, "serve")
    register_loadtest(sub, "loadtest")
    register_models(sub, "models")
    return parser


def register_generate(sub, name: str) -> None:
    gen = sub.add_parser(name, help="answer one or more prompts")
    gen.add_argument("prompts", nargs="+", metavar="PROMPT")
    add_model_arguments(gen)
    gen.add_argument(
        "--method",
        default=None,
        help=f"one of: {', '.join(method_names())} (default: the settings file's method, else cai)",
    )
    add_decoding_arguments(gen)
    gen.add_argument(
        "--settings",
        default=None,
        metavar="FILE",
        help=(
            "settings file (from caidllm calibrate, or a method's settings by hand) applied over the "
            "method's preset"
        ),
    )
    add_prompt_and_output_arguments(gen)
    gen.add_argument(
        "--prefix-cache-mb",
        default=None,
        metavar="MB",
        help="block-causal models: the prefix store's budget, prompts' blocks computed once across "
        "requests (0 = off; default: 1024 MB or an eighth of the device's memory)",
    )
    add_constraint_arguments(gen)
    add_tp_argument(gen)
    gen.set_defaults(handler=run_generate)


def run_generate(args) -> int:
    settings = None
    if args.settings is not None:
        from caidllm.decode.settings_file import load_settings

        settings = load_settings(args.settings)  # a bad file fails before the model loads
    given_method = args.method or (settings.method if settings else None)
    method = given_method or "cai"
    options = dict(
        gen_length=args.gen_length,
        block_length=args.block_length,
        steps=args.steps,
        cache=args.cache,
        threshold=args.threshold,
        temperature=args.temperature,
        seed=args.seed,
        editing_threshold=args.editing_threshold,
        max_post_steps=args.max_post_steps,
        minimal_topk=args.minimal_topk,
        sub_block=args.sub_block,
        early_stop=not args.no_early_stop,
        **set_values(args.set_values),
    )
    # A bad method or setting (or one the decoder that runs does not read: with no method given, a known
    # checkpoint's own, read from its config.json) fails before the model loads.
    decoded = check_before_load(args.model, given_method, settings, strict=True, **options)
    budget = check_budget(args.prefix_cache_mb, "--prefix-cache-mb")
    structured = {"constraint": cli_constraint(args)}
    from caidllm.parallel.launch import check_method, parallel_model

    check_method(decoded, args.tp)  # before any rank starts
    with parallel_model(args, args.tp) as lm:  # --tp N: this process is rank 0 of N it spawns
        method = recommended_method(lm.checkpoint, given_method or uniform_default(lm))
        if not uniform_default(lm):  # a uniform-state model's defaults are its generation_config.json's
            note_recommendation(lm, options, method)  # generate takes the same, as the caller's defaults
        chat = lm.chat_default if args.chat is None else args.chat
        results = lm.generate(
            args.prompts,
            method=method,
            settings=settings,
            batch_size=args.batch_size,
            chat=chat,
            prefix_cache_mb=budget,
            **structured,
            **options,
        )
    print_results(args, results, settings)
    return 0


def print_results(args, results, settings) -> None:
    """Each answer and its one-line summary (or, with --json, one JSON object per prompt)."""
    ran = {"settings": settings.summary()} if settings else {}
    label = f" with settings {args.settings}" if settings else ""
    for prompt, result in zip(args.prompts, results):
        if args.json:
            print(json.dumps({"prompt": prompt, **result.to_dict(), **ran}))
            continue
        print(result.text.strip())
        reused = (
            f", {result.reused_positions} prompt positions from the prefix cache"
            if result.reused_positions
            else ""
        )
        print(
            f"[{result.method}{label}: {result.nfe} forward passes, {result.answer_length} answer tokens, "
            f"{result.elapsed_s:.2f} s, {steps_summary(result.steps_per_block)}{reused}]"
        )
        if args.verbose:
            print(f"[steps per block: {result.steps_per_block}]")


def uniform_default(lm) -> str | None:
    """A uniform-state model's (DiffusionGemma's) own decoder when none is given; None for the others."""
    from caidllm.models.families import get_family

    return "diffusiongemma" if get_family(lm.config.family).uniform else None


def cli_constraint(args):
    """The structured-output flag given, as a Constraint whose errors name the flag (None: none given)."""
    from caidllm.decode.constraints import Constraint

    if args.json_schema is not None:
        return Constraint("json_schema", read_schema(args.json_schema), "--json-schema")
    given = [
        ("regex", args.regex, "--regex"),
        ("choice", args.choice, "--choice"),
        ("json_object", True if args.json_object else None, "--json-object"),
    ]
    return next((Constraint(kind, value, flag) for kind, value, flag in given if value is not None), None)


def read_schema(path: str):
    """--json-schema's file, read before the model loads (InputError naming the flag)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"--json-schema {path}: cannot read a JSON schema from it ({error})") from None


def note_recommendation(lm, options: dict, method: str = "cai") -> None:
    """Say on stderr which unset lengths, steps and temperature (and, running its own decoder, the
    threshold) generate takes from a known checkpoint's recommendation (models/checkpoints.py), and
    from where (a block length only to a method that lays blocks: presets.lays_blocks)."""
    from caidllm.decode.presets import lays_blocks
    from caidllm.models.checkpoints import recommended_options

    checkpoint = lm.checkpoint
    if checkpoint is None:
        return
    options, taken = recommended_options(checkpoint, method, **options)
    if not lays_blocks(method, **options):
        taken = [key for key in taken if key != "block_length"]
    r = checkpoint.recommended
    applied = ", ".join(f"{key} {options[key]:g}" for key in taken)
    if r.decoder is not None and method == r.decoder:
        applied = f"method {method}" + (f", {applied}" if applied else "")
    print(
        f"caidllm: {checkpoint.hub_id}: recommended settings applied: {applied or 'none (all given)'}; "
        f"confidence gating {'on' if lm.config.confidence_gating else 'off'}, f "
        f"{lm.config.cache_refresh_every}; "
        f"{'chat template' if checkpoint.instruct else 'base model: raw text'} by default (source: "
        f"{r.source})",
        file=sys.stderr,
    )


def steps_summary(steps_per_block: list[int]) -> str:
    """The summary line's steps: the blocks that ran (early stop leaves the rest at 0 steps) and their
    mean and largest step counts; the whole list (64 entries for 256 tokens in blocks of 4) is too long."""
    used = [steps for steps in steps_per_block if steps > 0]
    if not used:
        return f"0 of {len(steps_per_block)} blocks decoded"
    return (
        f"{len(used)} of {len(steps_per_block)} blocks decoded, steps per block mean "
        f"{sum(used) / len(used):.1f}, max {max(used)}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except CaidllmError as error:
        print(f"caidllm: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
