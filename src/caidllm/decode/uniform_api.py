"""`generate` for the uniform-state family (DiffusionGemma): decode/api.py's generate hands a model of
that family here. Prompts in, GenerationResults out, through UniformEngine (continuous batching)."""

from __future__ import annotations

import dataclasses
import time

from caidllm.decode.diffusiongemma_settings import UNIFORM_METHODS, build_settings
from caidllm.decode.uniform_engine import UniformEngine
from caidllm.errors import InputError

# generate()'s keywords of the mask-based decoders (and structured output, logprobs: not implemented for the
# uniform-state decoders yet): refused by name on this family
MASK_ONLY = (
    "block_length",
    "steps",
    "cache",
    "threshold",
    "temperature",
    "settings",
    "prefix_cache_mb",
    "json_schema",
    "regex",
    "choice",
    "json_object",
    "constraint",
    "logprobs",
    "top_logprobs",
    "compile",
)


def mask_decoder_refusal(family: str, method: str) -> str:
    return (
        f"model family {family!r} is uniform-state diffusion (no mask token; canvases of random tokens): "
        f"the mask-based decoder {method!r} does not apply; use {' or '.join(map(repr, UNIFORM_METHODS))}"
    )


def check_uniform(config, method: str | None, folder=None, **options):
    """The settings `method` (None: diffusiongemma) decodes with on a uniform-state model, checked (InputError
    naming the field: a mask-based decoder or setting, a bad value, a canvas length the checkpoint does not
    take); `options` as generate() takes them (None: unset)."""
    from caidllm.models.diffusion_gemma_config import dg_shape

    method = method or UNIFORM_METHODS[0]
    if method not in UNIFORM_METHODS:
        raise InputError(mask_decoder_refusal(config.family, method), "method")
    given = sorted(k for k in MASK_ONLY if options.get(k) is not None)
    if given:
        raise InputError(
            f"setting {given[0]!r} does not apply to the uniform-state decoder {method!r} (a mask-based "
            "decoder's, or not implemented for it); it takes max_denoising_steps, entropy_bound, t_min, "
            "t_max, stability_threshold, confidence_threshold, adaptive_stop, seed, gen_length",
            given[0],
        )
    if options.pop("early_stop", True) is False:
        options["adaptive_stop"] = False
    options = {k: v for k, v in options.items() if k not in MASK_ONLY}
    return build_settings(method, folder, **options).validate(dg_shape(config.raw).canvas_length)


def uniform_run_lengths(
    config, methods: list[tuple[str, dict]], gen_length=None, block_length=None, **common
):
    """gen_length and block_length (the canvas) of a run of several methods (bench, calibrate) on a
    uniform-state model, each method checked; None on a model of a mask-based family. A method of the
    other kind is refused by name either way, before anything runs. common: the run's temperature (only 0,
    the mask-based default, is taken: their temperature is the t_max -> t_min schedule) and early_stop
    (a request always ends with its end token's canvas)."""
    from caidllm.models.families import FAMILIES

    uniform = getattr(FAMILIES.get(config.family), "uniform", False)
    for preset, _ in methods:
        if uniform and preset not in UNIFORM_METHODS:
            raise InputError(mask_decoder_refusal(config.family, preset), "methods")
        if not uniform and preset in UNIFORM_METHODS:
            raise InputError(
                f"method {preset!r} is a uniform-state decoder (DiffusionGemma's): model family "
                f"{config.family!r} decodes with a mask token",
                "methods",
            )
    if not uniform:
        return None
    if common.get("temperature"):
        raise InputError(
            f"temperature {common['temperature']} does not apply to the uniform-state decoders: their "
            "temperature is the schedule t_max -> t_min",
            "temperature",
        )
    if block_length is not None:
        raise InputError(
            "block_length does not apply to the uniform-state decoders: they decode canvases of the "
            "checkpoint's length",
            "block_length",
        )
    canvas = [check_uniform(config, m, gen_length=gen_length, **extra) for m, extra in methods][
        0
    ].canvas_length
    return {"gen_length": gen_length or canvas, "block_length": canvas}


def generate_uniform(
    lm, token_prompts: list[list[int]], method: str | None, batch_size: int = 8, **options
) -> list:
    method = method or UNIFORM_METHODS[0]
    check_uniform(lm.config, method, getattr(lm, "path", None), **options)  # every prompt's settings alike
    options = {k: v for k, v in options.items() if k not in MASK_ONLY}
    engine = UniformEngine(lm, max_batch=batch_size, max_queue=len(token_prompts))
    started = time.perf_counter()
    ids = [
        engine.submit(p, check_uniform(lm.config, method, getattr(lm, "path", None), **options))
        for p in token_prompts
    ]
    try:
        results = {e.request_id: e.result for e in engine.run() if e.finished}
    except BaseException:
        engine.cancel_all()
        raise
    elapsed = time.perf_counter() - started
    policy, forward = engine.policy_timer.total(), engine.forward_timer.total()
    return [
        dataclasses.replace(results[i], elapsed_s=elapsed, policy_s=policy, forward_s=forward) for i in ids
    ]
