"""The server's settings from `caidllm serve`'s flags, for both launchers: one process
(serve/cli.py) and each Ray Serve replica (serve/ray_deployment.py)."""

from __future__ import annotations

import os
from pathlib import Path

from caidllm.errors import InputError
from caidllm.models.families import get_family


def check_api_key(args) -> str | None:
    """The key from `--api-key`, else CAIDLLM_API_KEY (None: none). An empty one (or only spaces) would
    turn authentication off without a word, and one with spaces at its ends would match no client (a
    request's key is read without them): both refused."""
    key, source = args.api_key, "--api-key"
    if key is None:
        key, source = os.environ.get("CAIDLLM_API_KEY"), "CAIDLLM_API_KEY"
    if key is not None and not key.strip():
        raise InputError(f"{source} is empty: give a key, or leave it out to serve without one")
    if key is not None and key != key.strip():
        raise InputError(
            f"{source} has spaces at its ends: no client's key would match (a request's key is "
            "read without them)"
        )
    return key


def settings_from(args, lm):
    from caidllm.models.checkpoints import recommended_method
    from caidllm.serve.app import ServerConfig
    from caidllm.serve.protocol import ServerDefaults

    api_key = _check_flags(args)
    checkpoint = getattr(lm, "checkpoint", None)
    from caidllm.decode.prefix_reuse import check_budget, make_store

    budget = check_budget(getattr(args, "prefix_cache_mb", None), "--prefix-cache-mb")
    if get_family(lm.config.family).uniform:  # DiffusionGemma: its own decoders and engine
        method, gen_length, block_length = _uniform_defaults(args, lm, budget)
    else:
        from caidllm.decode.uniform_api import refuse_on_mask_model

        refuse_on_mask_model(lm.config.family, settings_file_of(args))  # no request could read it
        # As generate: a known checkpoint's own decoder, unless a settings file is given (it applies to its
        # method).
        method = recommended_method(checkpoint if settings_file_of(args) is None else None, args.method)
        gen_length, block_length = _default_lengths(args, lm, checkpoint, method)
        if args.method is None and get_family(lm.config.family).sequential:  # its own block decoder
            method = "nemotron-dlm"
        make_store(lm, budget)  # a budget the model cannot use (full-sequence, past the memory) fails here
    name = args.served_model_name or ("tiny" if args.model == "tiny" else Path(args.model).name)
    defaults = ServerDefaults(
        model_name=name,
        method=method,
        gen_length=gen_length,
        block_length=block_length,
        max_gen_length=args.max_gen_length or lm.config.max_length,
        max_prompt_tokens=args.max_prompt_tokens,
        settings=settings_file_of(args),
    )
    return ServerConfig(
        defaults=defaults,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        api_key=api_key,
        max_request_time=args.max_request_time,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        shutdown_grace=args.shutdown_grace,
        step_policy=getattr(args, "step_policy", None),
        prefix_cache_mb=budget,
    )


def _check_flags(args):
    """Refuse a bounded flag out of its range, a bad API key or step policy; returns the API key."""
    from caidllm.decode.step_policies import make_step_policy

    for name in ("gen_length", "block_length", "max_batch", "port", "max_body_bytes", "body_timeout"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "port" else 1):
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {value}")
    api_key = check_api_key(args)
    if args.shutdown_grace < 0:
        raise InputError(f"--shutdown-grace must be >= 0, got {args.shutdown_grace}")
    if getattr(args, "step_policy", None) is not None:
        make_step_policy(args.step_policy)
    return api_key


def _uniform_defaults(args, lm, budget) -> tuple[str, int, int]:
    """A uniform-state model's default decoder (its own unless --method names the other; with --settings and
    no --method, the file's), gen_length (one canvas unless given) and block length (the canvas); the mask
    engine's flags refused by name, a settings file that does not apply to the decoder by `settings`."""
    from caidllm.decode.uniform_api import check_uniform, defaults_file

    given = {
        "--block-length": args.block_length,
        "--step-policy": getattr(args, "step_policy", None),
        "--prefix-cache-mb": budget or None,
    }
    for flag, value in given.items():
        if value is not None:
            raise InputError(
                f"{flag} does not apply to model family {lm.config.family!r}: uniform-state diffusion runs "
                "its own engine (canvases of the checkpoint's length, no prefix store)"
            )
    file = settings_file_of(args)
    method = args.method or (file.method if file is not None else None)
    own = defaults_file(lm.config.family, method, file)  # another decoder's: its requests' defaults
    settings = check_uniform(
        lm.config, method, getattr(lm, "path", None), gen_length=args.gen_length, settings=own
    )
    return (
        settings.method,
        settings.gen_length if args.gen_length else settings.canvas_length,
        (settings.canvas_length),
    )


def _default_lengths(args, lm, checkpoint, method: str) -> tuple[int, int]:
    """The requests' default gen_length and block_length. Unset ones as generate takes them (a known
    checkpoint's recommendation, a block-diffusion model's own block length); given ones are checked, and
    that they apply to the model's family."""
    from caidllm.decode.config import DecodeConfig
    from caidllm.decode.nemotron import SEQUENTIAL_METHODS, sequential_lengths
    from caidllm.decode.presets import config_for_model, options_for_model

    if get_family(lm.config.family).sequential or method in SEQUENTIAL_METHODS:  # decode/nemotron.py
        lengths = sequential_lengths(checkpoint, args.gen_length, args.block_length)
        return lengths["gen_length"], lengths["block_length"]
    config, _ = config_for_model(
        lm.config, checkpoint, method, gen_length=args.gen_length, block_length=args.block_length
    )
    block_length = config.block_length
    if config.whole_generation and args.block_length is None:
        # Elastic-Cache's one block of gen_length must not become the others' default (one given is kept).
        own = (
            options_for_model(lm.config, checkpoint, method, gen_length=args.gen_length)[0].get(
                "block_length"
            )
            or DecodeConfig.block_length
        )
        # Only one that lays whole blocks in the default gen_length: a request's canvas is whole blocks of it.
        block_length = own if config.gen_length % own == 0 else config.gen_length
    return config.gen_length, block_length


def settings_file_of(args):
    if getattr(args, "settings", None) is None:
        return None
    from caidllm.decode.settings_file import load_settings

    return load_settings(args.settings)
