"""build_config: a method preset (methods.py), a settings file's CAI values
(settings_file.py) over it, and the caller's keywords over both."""

from __future__ import annotations

from caidllm.decode.config import DecodeConfig
from caidllm.decode.methods import (  # noqa: F401 - the old import path
    BLOCK_DIFFUSION_PRESETS, PRESETS, method_names, preset_config, uses_cai)
from caidllm.decode.settings_file import load_settings
from caidllm.errors import InputError


def build_config(method: str, settings=None, strict: bool = False, **overrides) -> DecodeConfig:
    """The preset `method` with `overrides` applied (None values are ignored).

    Overrides may name any DecodeConfig field or any CAISettings field
    (CAI fields may also be given as a dict under `cai`). `settings`: a
    settings file (path, dict or CalibratedSettings, see settings_file.py) whose CAI
    values go over the preset and under `overrides`; `method` must be a
    CAI preset. strict: refuse a setting the method does not read (preset_config).
    """
    if settings is None:
        return preset_config(method, strict=strict, **overrides)
    if method not in PRESETS:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(PRESETS)}")
    settings = load_settings(settings)
    if not uses_cai(method):
        raise InputError(f"the settings {settings.source or ''} are CAI settings; method {method!r} does "
                         f"not run the CAI controller (use {settings.method!r} or another cai preset)")
    return preset_config(method, cai_under=settings.cai, strict=strict, **overrides)
