"""Validation of the settings of the post-2025 decoders (EB-Sampler, SlowFast, WINO):
each a clear InputError naming the setting, whatever the policy (a preset may be
overridden field by field, so every value is checked)."""

from __future__ import annotations

import math

from caidllm.errors import InputError


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _unit(name: str, value) -> None:
    if not (_number(value) and 0 < value <= 1):
        raise InputError(f"{name} must be in (0, 1], got {value!r}")


def check_decoder_settings(config) -> None:
    from caidllm.decode.config import EB_PROXIES

    if not (_number(config.eb_gamma) and config.eb_gamma > 0):
        raise InputError(f"eb_gamma must be a positive number, got {config.eb_gamma!r}")
    if config.eb_proxy not in EB_PROXIES:
        raise InputError(f"eb_proxy must be one of {', '.join(EB_PROXIES)}, got {config.eb_proxy!r}")
    if not _positive_int(config.sf_explore_steps):
        raise InputError(f"sf_explore_steps must be a positive integer, got {config.sf_explore_steps!r}")
    if not _positive_int(config.sf_window):
        raise InputError(f"sf_window must be a positive integer, got {config.sf_window!r}")
    if config.policy == "slowfast" and config.sf_window > config.block_length:
        raise InputError(f"sf_window ({config.sf_window}) is longer than the block ({config.block_length})")
    if not (_number(config.sf_std) and config.sf_std > 0):
        raise InputError(f"sf_std must be a positive number, got {config.sf_std!r}")
    for name in ("sf_cycle_threshold", "sf_high", "wino_draft", "wino_verify"):
        _unit(name, getattr(config, name))
    if config.wino_draft > config.wino_verify:
        raise InputError(f"WINO thresholds out of order: wino_draft ({config.wino_draft}) must not exceed "
                         f"wino_verify ({config.wino_verify}) (draft wide, verify narrow)")
    if not _positive_int(config.wino_max_steps):
        raise InputError(f"wino_max_steps must be a positive integer, got {config.wino_max_steps!r}")
    if config.policy == "wino" and config.cache != "none":
        raise InputError(f"policy 'wino' with cache={config.cache!r} is not meaningful: WINO's verify forward reads "
                         "the whole canvas with a shadow block each step (use cache='none')")
