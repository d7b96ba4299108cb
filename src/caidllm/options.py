"""What every command-line front end shares: the model flags, loading the model they name,
and small checks of flag values. Below every sub-command (cli.py, bench, serve, train)."""

from __future__ import annotations

import argparse
import json
import sys

from caidllm.errors import InputError


def json_object_option(text: str, flag: str, what: str = "object") -> dict:
    """The JSON object a flag carries, or an InputError naming the flag."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{flag} is not valid JSON: {error.msg}") from None
    if not isinstance(value, dict):
        raise InputError(f"{flag} must be a JSON {what}")
    return value


def nest_owner_keys(values: dict) -> dict:
    """OWNER.FIELD names under their owner's key ({"eb.gamma": 0.02} -> {"eb": {"gamma": 0.02}}), a flat
    name as is: how --set and lm-eval's model_args name a method's own settings."""
    nested: dict = {}
    for name, value in values.items():
        owner, dot, field = name.partition(".")
        if dot:
            nested.setdefault(owner, {})[field] = value
        else:
            nested[name] = value
    return nested


def set_values(items: list[str]) -> dict:
    """--set NAME=VALUE items as keywords (nest_owner_keys: OWNER.FIELD under the owner's key); VALUE as
    JSON (0.02, true, [1, 2]), else the text. The decoder checks every value."""
    values: dict = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise InputError(f"--set takes NAME=VALUE, got {item!r}", field="set")
        try:
            values[name] = json.loads(text)
        except ValueError:
            values[name] = text
    return nest_owner_keys(values)


MODEL_HELP = (
    "model folder (Hugging Face layout), a hub id ORG/NAME[@REVISION] (huggingface_hub's cache, token and "
    "HF_HUB_OFFLINE; caidllm models lists the known ones), 'tiny' (default), or random weights of an "
    "official "
    "shape: random:llada-8b, random:dream-7b, random:llada-moe-7b ..., with config.json overrides: "
    "'random:llada-8b?n_layers=4'"
)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help=MODEL_HELP)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument(
        "--dtype", default=None, help="bfloat16, float16 or float32 (default: the checkpoint's)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="run the layers' dense parts through torch.compile"
    )
    parser.add_argument(
        "--moe-kernel",
        default="auto",
        choices=["auto", "loop", "grouped", "sized", "padded", "native"],
        help="how a mixture-of-experts layer runs its experts (models/moe_kernels.py): auto (default: "
        "native on one or two CPU threads where it builds, else sized or grouped on a CPU; grouped "
        "matmuls where they run without a host sync), loop (the per-expert reference), grouped, "
        "sized, padded, native (a compiled CPU kernel, built on first use by the C++ compiler)",
    )
    add_quantize_arguments(parser)


def add_tp_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor parallelism: divide the model among N ranks this command spawns (attention heads, "
        "feed-forward widths and experts; gloo on a CPU, nccl with one GPU per rank)",
    )
    parser.add_argument(
        "--tp-timeout",
        type=float,
        default=None,
        metavar="S",
        help="with --tp: seconds any wait on a rank may last (joining, a forward's sum, an idle "
        "server's keep-alive) and a stopped rank counts as hung; then the group stops "
        "(default 120)",
    )


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    from caidllm.models.quantize import quantization_names

    parser.add_argument(
        "--quantize",
        default=None,
        metavar="KIND",
        help="torchao quantized weights for the layers' linear layers: "
        f"{', '.join(quantization_names())} (int4 and fp8 with --dtype bfloat16; fp8 on CUDA compute "
        "capability 8.9+ only; "
        "pip install 'caidllm[quant]')",
    )
    parser.add_argument(
        "--quantize-head",
        action="store_true",
        help="quantize the output head too (default: it stays in the model dtype, like the embeddings)",
    )


def load_model(args, shard=None, quiet: bool = False):
    """The model the flags name (`shard`: a tensor-parallel rank's reader, parallel/loading.py;
    `quiet`: no note on stderr, for ranks other than 0)."""
    from caidllm.models import load

    lm = load(
        args.model,
        device=args.device,
        dtype=args.dtype,
        compile=getattr(args, "compile", False),
        quantize=getattr(args, "quantize", None),
        quantize_head=getattr(args, "quantize_head", False),
        moe_kernel=getattr(args, "moe_kernel", "auto"),
        shard=shard,
    )
    if getattr(lm, "random_weights", False) and not quiet:
        print(
            f"caidllm: {args.model}: the weights are random; the text and any accuracy mean nothing",
            file=sys.stderr,
        )
    return lm


def model_config_of(name):
    """(ModelConfig, known Checkpoint or None) of the model `name` from its config.json alone (no weight
    read; a random: shape built on the meta device): what a command checks its settings against before
    it loads the model. A name that does not resolve fails as loading it would."""
    from caidllm.models.checkpoints import identify
    from caidllm.models.families import load_config
    from caidllm.models.loading import load, resolve_folder
    from caidllm.models.random_init import is_random_name

    if is_random_name(name):
        return load(name, device="meta").config, None
    folder, hub_id = resolve_folder(name)
    config = load_config(folder / "config.json")
    return config, identify(folder, config.raw, hub_id)


def check_before_load(model_name, method: str | None, settings=None, strict: bool = False, **options):
    """Refuse a bad or inapplicable setting before the model loads (InputError): the config `method`
    (None: a known checkpoint's own decoder, else cai) would decode with on the model (decode/presets.py,
    config_for_model), from its config.json alone."""
    from caidllm.decode.nemotron import SEQUENTIAL_METHODS
    from caidllm.decode.presets import config_for_model
    from caidllm.models.checkpoints import recommended_method

    config, checkpoint = model_config_of(model_name)
    from caidllm.models.families import get_family

    if get_family(config.family).uniform:  # DiffusionGemma: its own decoders, checked as generate checks them
        from caidllm.decode.uniform_api import check_uniform

        return check_uniform(config, method, settings=settings, **options)
    from caidllm.decode.uniform_api import refuse_on_mask_model

    refuse_on_mask_model(config.family, settings)  # a diffusiongemma-cai file: named, not its method
    method = recommended_method(checkpoint if settings is None else None, method)
    if get_family(config.family).sequential or method in SEQUENTIAL_METHODS:  # checked by generate itself
        return None
    return config_for_model(config, checkpoint, method, settings, strict, **options)[0]


def lengths_for_run(
    model_name, lm, methods: list[tuple[str, dict]], gen_length=None, block_length=None, **common
) -> dict:
    """gen_length and block_length of a run of several methods at the same lengths (bench, calibrate):
    unset ones as generate takes them for the first method that lays blocks (decode/presets.py,
    config_for_model), every method then checked at them against the model: `lm`'s config, or when `lm`
    is None `model_name`'s config.json alone (before the model loads). methods: (preset, extra keywords)
    pairs."""
    from caidllm.decode.nemotron import SEQUENTIAL_METHODS, sequential_lengths
    from caidllm.decode.presets import config_for_model, take_the_runs_block
    from caidllm.decode.uniform_api import uniform_run_lengths

    config, checkpoint = (
        (lm.config, getattr(lm, "checkpoint", None)) if lm is not None else model_config_of(model_name)
    )
    uniform = uniform_run_lengths(config, methods, gen_length, block_length, **common)  # DiffusionGemma's
    if uniform is not None:
        return uniform
    lengths = dict(gen_length=gen_length, block_length=block_length)
    takes = take_the_runs_block(methods)
    fixed = None
    # The first method that takes the run's block fixes the lengths the others are checked at: one whose
    # own layout differs (Elastic-Cache's one block of gen_length) must not set the block-wise methods'
    # block length, nor take theirs.
    for i in sorted(range(len(methods)), key=lambda i: not takes[i]):
        preset, extra = methods[i]
        shared = dict(fixed or lengths, **({} if takes[i] else {"block_length": None}))
        if preset in SEQUENTIAL_METHODS:  # decode/nemotron.py: its own defaults, checked by generate
            fixed = fixed or sequential_lengths(checkpoint, **shared)
            continue
        decoded, _ = config_for_model(config, checkpoint, preset, **extra, **shared, **common)
        fixed = fixed or dict(gen_length=decoded.gen_length, block_length=decoded.block_length)
    return fixed or lengths
