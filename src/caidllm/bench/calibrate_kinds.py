"""What `caidllm calibrate` searches on a model, by the model's kind: the methods it calibrates, the
baseline whose accuracy sets the floor, the grid, the start and the keywords each decode takes.

- mask (every mask-based family): a CAI preset's controller (`cai`, ...), against `vanilla`;
- uniform (uniform-state diffusion, DiffusionGemma): `diffusiongemma-cai`'s own settings (dgcai, see
  decode/diffusiongemma_cai.py), against the official sampler `diffusiongemma`. Both decoders sample: every
  decode, the baseline's and each trial's, runs with the run's seed (a hash of it and the prompt per
  request, decode/sampling.py), so a trial's accuracy and NFE are reproducible.

One search (calibrate.coordinate_search) runs either: it is given the kind's space and switches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from caidllm.bench.calibrate import SEARCH_SPACE, SWITCHES
from caidllm.errors import InputError

# diffusiongemma-cai's settings that move NFE most, the values tried (the defaults among them), in the order
# the search visits them: the low-yield exit first (on tiny-dg, boolean_expressions, 32 held-out samples, only
# it moved NFE: entropy_end and warmup changed no decode, gating 0.03 forwards). Left out: canvas_relax and
# entropy_end_cap act from a request's second canvas only (an answer of one canvas, the default gen_length,
# never reads them); the switches other than gating are ablations.
UNIFORM_SPACE: dict[str, tuple] = {
    "grinding_patience": (2, 3, 4, 6),  # low-yield steps in a row that end a canvas ...
    "grinding_yield": (
        0.005,
        0.015,
        0.05,
    ),  # ... a step low-yield under this fraction of changed argmaxes ...
    "fallback_entropy": (0.5, 1.0, 2.0),  # ... when its mean entropy is under this (nats)
    "gating": (True, False),  # budgets: easy and normal positions accepted with their argmax from a step on
    "entropy_end": (0.3, 0.5, 0.8, 1.2),  # the per-position bound the cosine relaxes to (nats)
    "warmup": (0.0, 0.15, 0.3),  # fraction of the steps held at entropy_start
}
# With `gating` off the budgets do nothing; with `grinding` off (not searched) the low-yield exit.
UNIFORM_SWITCHES = {
    "gating": frozenset({"budget_fractions"}),
    "grinding": frozenset({"grinding_patience", "grinding_yield", "fallback_entropy"}),
}


@dataclass(frozen=True)
class CalibrationKind:
    kind: str  # "mask" or "uniform"
    default_method: str  # --method's default
    baseline: str  # the method whose accuracy (minus --max-loss) is the floor
    baseline_title: str  # how the table and the settings file name it
    baseline_key: str  # the settings file's calibration key of its decode
    owner: str  # the settings file's key of the values found
    default_name: str  # --name's default: the row caidllm bench gives the file
    space: dict[str, tuple]
    switches: dict[str, frozenset]
    check: Callable[[object, str], None]  # (CalibrateOptions, family): InputError naming the field
    start: Callable[[object, str], dict]  # (lm, method) -> the start's values of the searched settings
    wrap: Callable[[dict], dict]  # a trial's values -> generate() keywords
    decode_options: Callable[[object], dict]  # CalibrateOptions -> the keywords every decode takes
    block_name: str = "block_length"  # what the run's block_length is, in the table
    seeded: bool = False  # every decode sampled with the run's seed (the table and the file say so)


def _mask_check(options, family: str) -> None:
    """A CAI preset, its lengths together when both are given."""
    from caidllm.decode.methods import uses_cai
    from caidllm.decode.presets import build_config
    from caidllm.decode.uniform_decoders import UNIFORM_METHODS

    method = options.method
    if method in UNIFORM_METHODS:
        raise InputError(
            f"method {method!r} is a uniform-state decoder (DiffusionGemma's); model family {family!r} "
            "decodes with a mask token: calibrate a cai preset (default cai)",
            "method",
        )
    if not uses_cai(method):
        raise InputError(
            f"method {method!r} does not run the CAI controller; calibrate a cai preset", "method"
        )
    lengths = dict(gen_length=options.gen_length, block_length=options.block_length)
    build_config(method, **(lengths if None not in lengths.values() else {}))


def _mask_start(lm, method: str) -> dict:
    """The preset's values of the searched settings (gating resolved to the model's default)."""
    from caidllm.decode.presets import build_config

    cai = build_config(method).policy_settings
    values = {f.name: getattr(cai, f.name) for f in fields(cai) if f.name in SEARCH_SPACE}
    if values.get("gating") is None:
        values["gating"] = bool(lm.config.confidence_gating)
    return values


def _uniform_check(options, family: str) -> None:
    """diffusiongemma-cai (the lengths are checked against the model by uniform_run_lengths)."""
    method = options.method
    if method != UNIFORM.default_method:
        raise InputError(
            f"method {method!r}: on model family {family!r} (uniform-state diffusion) caidllm calibrate "
            f"searches the settings of {UNIFORM.default_method!r} (dgcai.*), against the official sampler "
            f"{UNIFORM.baseline!r}; give --method {UNIFORM.default_method} or leave --method out",
            "method",
        )


def _uniform_start(lm, method: str) -> dict:
    """The decoder's defaults of the searched settings."""
    from caidllm.decode.uniform_decoders import UNIFORM_DECODERS

    defaults = UNIFORM_DECODERS[method].settings()
    return {name: getattr(defaults, name) for name in UNIFORM_SPACE}


MASK = CalibrationKind(
    kind="mask",
    default_method="cai",
    baseline="vanilla",
    baseline_title="vanilla",
    baseline_key="vanilla",
    owner="cai",
    default_name="cai-calibrated",
    space=SEARCH_SPACE,
    switches=SWITCHES,
    check=_mask_check,
    start=_mask_start,
    wrap=dict,  # flat names (theta_end, ...): the cai policy's
    decode_options=lambda o: {"gen_length": o.gen_length, "block_length": o.block_length},
)
UNIFORM = CalibrationKind(
    kind="uniform",
    default_method="diffusiongemma-cai",
    baseline="diffusiongemma",
    baseline_title="the official sampler diffusiongemma",
    baseline_key="baseline",
    owner="dgcai",
    default_name="dgcai-calibrated",
    space=UNIFORM_SPACE,
    switches=UNIFORM_SWITCHES,
    check=_uniform_check,
    start=_uniform_start,
    wrap=lambda values: {"dgcai": dict(values)},
    decode_options=lambda o: {"gen_length": o.gen_length, "seed": o.seed},
    block_name="canvas",
    seeded=True,
)
KINDS = {k.kind: k for k in (MASK, UNIFORM)}


def calibration_kind(model_name, lm=None) -> tuple[CalibrationKind, str]:
    """The kind of `lm` (or, before it loads, of `model_name` from its config.json alone) and its family."""
    from caidllm.models.families import get_family
    from caidllm.options import model_config_of

    family = lm.config.family if lm is not None else model_config_of(model_name)[0].family
    return KINDS["uniform" if get_family(family).uniform else "mask"], family
