"""build_config: a method preset (methods.py), a settings file's CAI values
(settings_file.py) over it, and the caller's keywords over both."""

from __future__ import annotations

from caidllm.decode.block_diffusion import fit_to_model, own_block_length
from caidllm.decode.config import DecodeConfig
from caidllm.decode.methods import PRESETS, preset_config
from caidllm.decode.settings_file import load_settings
from caidllm.errors import InputError
from caidllm.models.checkpoints import recommended_options


def build_config(method: str, settings=None, strict: bool = False, filled=(), **overrides) -> DecodeConfig:
    """The preset `method` with `overrides` applied (None values are ignored).

    Overrides name a shared DecodeConfig field or a method's setting (preset_config). `settings`: a
    settings file (path, dict or CalibratedSettings, see settings_file.py) whose values go over the
    preset and under `overrides`; they must be settings of `method`. strict: refuse a setting the
    method does not read (preset_config). filled: the overrides that are defaults filled for the
    caller, not given by it (preset_config).
    """
    if settings is None:
        return preset_config(method, strict=strict, filled=filled, **overrides)
    if method not in PRESETS:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(PRESETS)}", field="method")
    settings = load_settings(settings)
    settings.check_applies(method)
    return preset_config(method, file_values=settings.values, strict=strict, filled=filled, **overrides)


def options_for_model(model, checkpoint, method: str, settings=None, **options) -> tuple[dict, list[str]]:
    """`options` with the unset (None) ones a command does not give filled as every command takes
    them (generate, serve, bench, calibrate, the lm-eval adapter): lengths, steps and temperature
    from a known checkpoint's recommendation (models/checkpoints.py; `checkpoint` None: none), then
    for a block-diffusion model (its ModelConfig `model`) the preset's block length where the model
    decodes with it, else the model's own. Returns them and the names filled (none is the caller's)."""
    options, taken = recommended_options(checkpoint, method, **options)
    if options.get("block_length") is None and model.block_lengths:
        # Before the lengths are checked together: a gen_length that is whole blocks of the model's own.
        options["block_length"] = own_block_length(
            build_config(method, settings=settings).block_length, model
        )
        taken = [*taken, "block_length"]
    return options, taken


def config_for_model(
    model, checkpoint, method: str, settings=None, strict: bool = False, **options
) -> tuple[DecodeConfig, list[str]]:
    """The config `method` runs with on the model, unset options filled (options_for_model) and fitted
    to the model's family (block_diffusion.fit_to_model: a setting given that does not apply raises
    InputError naming it; a preset's cache the family lacks becomes its own). strict: a setting the
    caller gave that the method does not read is refused too (methods.refuse_unread; the recommendation's
    values are not the caller's). Returns it and the names filled (options_for_model)."""
    options, taken = options_for_model(model, checkpoint, method, settings, **options)
    config = build_config(method, settings=settings, filled=taken, **options)
    return fit_to_model(config, model, strict=strict), taken


def lays_blocks(method: str, /, **options) -> bool:
    """Whether `method` (with `options`: only its cache and elastic_scope decide) decodes in blocks of
    block_length: Elastic-Cache's official loop (DecodeConfig.whole_generation) lays one block of
    gen_length, and a block length given to it is refused."""
    from caidllm.decode.nemotron import SEQUENTIAL_METHODS

    if (
        method in SEQUENTIAL_METHODS
    ):  # ar, nemotron-dlm, linear-spec take the run's block (decode/nemotron.py)
        return True
    options = {k: options[k] for k in ("cache", "elastic", "elastic_scope") if options.get(k) is not None}
    return not build_config(method, **options).whole_generation


def decodes_one_block(method, /, **options) -> bool:
    """Whether `method` (with `options`) decodes the whole canvas as one block (not lays_blocks); False
    for a method or option that is wrong, which building its config then names. Positional `method`:
    options may be a whole request body, its own "method" among them (the soak's)."""
    try:
        return not lays_blocks(method, **options)
    except InputError:
        return False


def take_the_runs_block(methods: list[tuple[str, dict]]) -> list[bool]:
    """Which of several methods run side by side (bench, calibrate) take the run's block_length: those
    that lay blocks, not Elastic-Cache's official loop (one block of gen_length: the bench's row says
    so), unless no method of the run lays blocks (a block length given then is refused by the decoder).
    methods: (preset, extra keywords) pairs."""
    blocks = [lays_blocks(preset, **extra) for preset, extra in methods]
    return [b or not any(blocks) for b in blocks]


def run_lengths(methods: list[tuple[str, dict]], gen_length=None, block_length=None) -> list[dict]:
    """The lengths each of several methods run side by side takes (take_the_runs_block)."""
    return [
        dict(gen_length=gen_length, block_length=block_length if takes else None)
        for takes in take_the_runs_block(methods)
    ]
