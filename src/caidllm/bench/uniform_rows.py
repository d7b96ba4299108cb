"""The settings a uniform-state decoder's bench row runs with (DiffusionGemma's diffusiongemma, greedy,
diffusiongemma-cai): `caidllm bench --set NAME=VALUE` gives the shared knobs (max_denoising_steps,
entropy_bound, ...) to every such row and a decoder's own settings (OWNER.FIELD, e.g. dgcai.warmup) to the
rows of the decoder that has them; --no-early-stop turns the stable-and-confident stop off, as
`caidllm generate --no-early-stop` does."""

from __future__ import annotations

import dataclasses

from caidllm.decode.diffusiongemma_settings import FIELDS, build_settings
from caidllm.decode.uniform_decoders import UNIFORM_DECODERS, UNIFORM_METHODS
from caidllm.errors import InputError


def _owner(preset: str) -> str | None:
    own = UNIFORM_DECODERS[preset].settings
    return None if own is None else own.OWNER


def row_values(preset: str, values: dict, early_stop: bool = True) -> dict:
    """The --set values a uniform-state row takes: every flat one, its own decoder's owner key."""
    owners = {_owner(m) for m in UNIFORM_METHODS} - {None}
    taken = {k: v for k, v in values.items() if k not in owners or k == _owner(preset)}
    if not early_stop:
        taken.setdefault("adaptive_stop", False)
    return taken


def check_set_values(presets: list[str], values: dict) -> None:
    """Each --set value checked by the rows that take it (InputError naming it), before the model loads; a
    value no row reads is refused by name."""
    if not values:
        return
    uniform = [p for p in presets if p in UNIFORM_METHODS]
    if not uniform:
        raise InputError(
            "--set gives the uniform-state decoders' rows (DiffusionGemma's) their settings; a mask-based "
            f"method ({presets[0]!r}) takes its tuned values from --settings FILE",
            "set",
        )
    owners = {_owner(p) for p in uniform}
    for name, value in values.items():
        if isinstance(value, dict) and name not in owners:
            raise InputError(
                f"--set {name}.*: no row of this run reads {name!r} settings (rows: {', '.join(uniform)})",
                "set",
            )
    for preset in uniform:
        build_settings(preset, **row_values(preset, values)).validate()


def uniform_summary(config) -> dict:
    """A uniform-state row's settings as the report records them: {method: the shared knobs} and, for a
    decoder with settings of its own, {OWNER: its fields} (the defaults where none were given)."""
    summary = {config.method: {f: getattr(config, f) for f in sorted(FIELDS - {"method"})}}
    own = config.decoder_settings or (UNIFORM_DECODERS[config.method].settings or type(None))()
    if own is not None:
        summary[own.OWNER] = dataclasses.asdict(own)
    return summary
