"""`generate` for the uniform-state family (DiffusionGemma): decode/api.py's generate hands a model of
that family here. Prompts in, GenerationResults out, through UniformEngine (continuous batching)."""

from __future__ import annotations

import dataclasses
import time

from caidllm.decode.diffusiongemma_settings import UNIFORM_METHODS, build_settings
from caidllm.decode.uniform_decoders import UNIFORM_DECODERS
from caidllm.decode.uniform_engine import UniformEngine
from caidllm.errors import InputError

# generate()'s keywords of the mask-based decoders (and structured output, logprobs: not implemented for the
# uniform-state decoders yet): refused by name on this family. `settings` (a settings file) is taken by a
# decoder with settings of its own (diffusiongemma-cai: with_settings_file), refused by name on the others.
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


# the uniform-state decoders that take a settings file (settings of their own)
_SETTLED = tuple(m for m, d in UNIFORM_DECODERS.items() if d.settings is not None)


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
    options = with_settings_file(config.family, method, options)
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


def with_settings_file(family: str | None, method: str, options: dict) -> dict:
    """`options` with a settings file's values (options["settings"]: a path, dict or CalibratedSettings,
    decode/settings_file.py) taken out and put under the decoder's own keyword: the file's values over the
    decoder's defaults, under the caller's (its dgcai dict's keys win; a CaiUniformSettings given whole wins
    whole). A file of a mask-based method's settings, or one given to a decoder without settings of its own,
    is refused naming `settings`."""
    if options.get("settings") is None:
        return options
    from caidllm.decode.settings_file import load_settings

    options = dict(options)
    loaded = load_settings(options.pop("settings"))
    where = f"settings file {loaded.source}" if loaded.source else "settings"
    if loaded.method not in UNIFORM_METHODS:
        raise InputError(
            f"the {where} holds settings of the mask-based method {loaded.method!r}; "
            f"{f'model family {family!r}' if family else 'this model'} is uniform-state diffusion: calibrate "
            f"its decoder with caidllm calibrate --method {_SETTLED[0]}",
            "settings",
        )
    if method not in UNIFORM_DECODERS:  # a mask-based decoder asked for: refused by name next
        return options
    own = UNIFORM_DECODERS[method].settings
    if own is None:
        raise InputError(
            f"a settings file does not apply to the uniform-state decoder {method!r}: it has no settings of "
            f"its own (the {where} are for {loaded.method!r}; decoders that take one: {', '.join(_SETTLED)})",
            "settings",
        )
    loaded.check_applies(method)
    given = options.get(own.OWNER)
    if given is None or isinstance(given, dict):
        options[own.OWNER] = {**loaded.values.get(own.OWNER, {}), **(given or {})}
    return options


def refuse_on_mask_model(family: str, settings) -> None:
    """A settings file of a uniform-state decoder (diffusiongemma-cai's) given with a mask-based model:
    refused naming `settings` (it is not the method's fault when the method came from the file)."""
    from caidllm.decode.settings_file import load_settings

    loaded = load_settings(settings) if settings is not None else None
    if loaded is not None and loaded.method in UNIFORM_METHODS:
        where = f"settings file {loaded.source}" if loaded.source else "settings"
        raise InputError(
            f"the {where} holds settings of the uniform-state decoder {loaded.method!r} (DiffusionGemma's); "
            f"model family {family!r} decodes with a mask token (calibrate a cai preset for it)",
            "settings",
        )


def defaults_file(family: str | None, method: str | None, settings):
    """A server's settings file (`caidllm serve --settings`) as the default decoder `method` takes it: the
    file when it is that decoder's, else None (it is the defaults of its own method's requests, as on a
    mask-based model); a file no uniform-state decoder reads is refused naming `settings`."""
    if settings is None:
        return None
    with_settings_file(family, getattr(settings, "method", None) or "", {"settings": settings})
    return settings if settings.method == (method or UNIFORM_METHODS[0]) else None


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
    for preset, extra in methods:
        if uniform and preset not in UNIFORM_METHODS:
            if extra.get("settings") is not None:  # a settings file's method: the file is what is wrong
                with_settings_file(config.family, preset, extra)
            raise InputError(mask_decoder_refusal(config.family, preset), "methods")
        if not uniform and preset in UNIFORM_METHODS:
            refuse_on_mask_model(config.family, extra.get("settings"))
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
    options = with_settings_file(lm.config.family, method, options)  # read once
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
