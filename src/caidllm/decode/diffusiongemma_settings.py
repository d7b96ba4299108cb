"""Settings of the uniform-state decoders (DiffusionGemma's entropy-bound sampler), owned by the method.

Defaults are the released checkpoint's generation_config.json (models/diffusion_gemma_config.py's
GENERATION_DEFAULTS); a checkpoint folder's own generation_config.json overrides them
(``from_generation_config``); each keyword the caller gives overrides both. Every knob is checked in
``validate`` with an InputError naming the field.

Methods (decode/uniform_decoders.py, the registry): ``diffusiongemma`` (sample each position from the
temperature-scaled logits, the official sampler), ``greedy`` (the argmax instead of a sample; canvas
initialisation and renoising still draw from the request's generator, seeded: reproducible) and
``diffusiongemma-cai`` (the official sampler with CAI-style per-position acceptance, its own settings
under ``dgcai``: decode/diffusiongemma_cai.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from caidllm.checks import is_int, is_number
from caidllm.decode.uniform_decoders import UNIFORM_DECODERS, UNIFORM_METHODS
from caidllm.errors import InputError
from caidllm.models.diffusion_gemma_config import GENERATION_DEFAULTS


@dataclass
class DiffusionGemmaSettings:
    method: str = "diffusiongemma"
    gen_length: int = 256  # new tokens wanted: ceil(gen_length / canvas_length) canvases at most
    canvas_length: int | None = None  # None: the checkpoint's; any other value is refused (trained length)
    max_denoising_steps: int = GENERATION_DEFAULTS["max_denoising_steps"]
    entropy_bound: float = GENERATION_DEFAULTS["entropy_bound"]
    t_min: float = GENERATION_DEFAULTS["t_min"]
    t_max: float = GENERATION_DEFAULTS["t_max"]
    # stable-and-confident stop: argmax unchanged over stability_threshold steps and mean entropy under
    # confidence_threshold; adaptive_stop False runs every step (the official generate without them)
    stability_threshold: int = GENERATION_DEFAULTS["stability_threshold"]
    confidence_threshold: float = GENERATION_DEFAULTS["confidence_threshold"]
    adaptive_stop: bool = True
    seed: int | None = None  # None: a fresh seed (diffusiongemma), 0 (greedy)
    # exact_seed: the request's generator is seeded with `seed` itself (transformers' torch.manual_seed(seed)
    # at batch 1); else with a hash of seed and prompt (decode/sampling.py), as every caidllm decoder
    exact_seed: bool = False
    sample_chunk: int = 64  # canvas positions whose float32 probabilities exist at once (peak memory)
    # provisional: each step's event carries the draft (the argmax canvas, the official streamer's put_draft)
    # and the positions the step accepted; off: only finished canvases are streamed
    stream_draft: bool = False
    decoder_settings: object | None = None  # the decoder's own settings (uniform_decoders.py), if it has any
    given: set = field(default_factory=set, repr=False, compare=False)

    @property
    def sample(self) -> bool:
        decoder = UNIFORM_DECODERS.get(self.method)
        return decoder is None or decoder.sample

    # What a front end reads of any decode config (the mask-based DecodeConfig has the same names):
    @property
    def early_stop(self) -> bool:
        """A request always ends with the canvas that holds its end token."""
        return True

    @property
    def block_length(self) -> int | None:
        """The canvas is the block of this family (None until validated against a checkpoint)."""
        return self.canvas_length

    @property
    def steps_per_block(self) -> int:
        """The most denoising steps (decoder forwards) a canvas takes."""
        return self.max_denoising_steps

    def validate(self, canvas_length: int | None = None) -> DiffusionGemmaSettings:
        if self.method not in UNIFORM_METHODS:
            raise InputError(
                f"method {self.method!r}: the uniform-state decoders are {', '.join(UNIFORM_METHODS)}",
                "method",
            )
        for name in ("gen_length", "max_denoising_steps", "sample_chunk"):
            _positive_int(name, getattr(self, name))
        if not is_int(self.stability_threshold) or self.stability_threshold < 0:
            raise InputError(
                f"stability_threshold must be an integer >= 0, got {self.stability_threshold!r}",
                "stability_threshold",
            )
        for name in ("entropy_bound", "confidence_threshold"):
            value = getattr(self, name)
            if not is_number(value) or not value > 0:
                raise InputError(f"{name} must be a number > 0, got {value!r}", name)
        for name in ("t_min", "t_max"):
            if not is_number(getattr(self, name)) or getattr(self, name) < 0:
                raise InputError(f"{name} must be a number >= 0, got {getattr(self, name)!r}", name)
        if not self.t_max > self.t_min:
            raise InputError(f"t_max ({self.t_max}) must be greater than t_min ({self.t_min})", "t_max")
        if self.seed is not None and not is_int(self.seed):
            raise InputError(f"seed must be an integer, got {self.seed!r}", "seed")
        for name in ("adaptive_stop", "exact_seed", "stream_draft"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be true or false, got {getattr(self, name)!r}", name)
        self._validate_own()
        if canvas_length is not None:
            if self.canvas_length is not None and self.canvas_length != canvas_length:
                raise InputError(
                    f"canvas_length {self.canvas_length!r}: this checkpoint decodes canvases of "
                    f"{canvas_length} tokens (its trained length) only",
                    "canvas_length",
                )
            self.canvas_length = canvas_length
        return self

    def _validate_own(self) -> None:
        """The decoder's own settings: its defaults where none were given, each field checked."""
        own = UNIFORM_DECODERS[self.method].settings
        if own is None:
            return
        if self.decoder_settings is None:
            self.decoder_settings = own()
        if not isinstance(self.decoder_settings, own):
            raise InputError(
                f"{own.OWNER} must be an object of {own.TITLE} settings ({own.__name__} or a dict of its "
                f"fields), got {type(self.decoder_settings).__name__}",
                field=own.OWNER,
            )
        self.decoder_settings.validate()


def _positive_int(name: str, value) -> None:
    if not is_int(value) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}", name)


FIELDS = {f.name for f in dataclasses.fields(DiffusionGemmaSettings)} - {"given", "decoder_settings"}
# generation_config.json's names -> the settings' (the entropy bound may sit in a sampler_config object)
GENERATION_KEYS = (
    "max_denoising_steps",
    "entropy_bound",
    "t_min",
    "t_max",
    "stability_threshold",
    "confidence_threshold",
)


def checkpoint_defaults(folder) -> dict:
    """The sampler knobs a checkpoint folder's generation_config.json sets (none when absent)."""
    path = Path(folder) / "generation_config.json" if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    sampler = raw.get("sampler_config") if isinstance(raw.get("sampler_config"), dict) else {}
    found = {k: raw[k] for k in GENERATION_KEYS if raw.get(k) is not None}
    if sampler.get("entropy_bound") is not None:
        found["entropy_bound"] = sampler["entropy_bound"]
    return found


def build_settings(method: str, folder=None, **options) -> DiffusionGemmaSettings:
    """Settings of `method`: its defaults, the checkpoint's generation_config.json, then `options`
    (None values left out); an unknown option is refused naming it (a mask-based decoder's setting). A
    decoder with settings of its own takes them under their OWNER key, a dict or the dataclass."""
    options = dict(options)
    own = _own_settings(method, options)
    unknown = sorted(k for k, v in options.items() if k not in FIELDS and v is not None)
    if unknown:
        own_cls = getattr(UNIFORM_DECODERS.get(method), "settings", None)
        hint = ""
        if own_cls is not None and unknown[0] in own_cls.field_names():  # its own setting, given flat
            hint = f"; give it as {own_cls.OWNER}.{unknown[0]}"
        raise InputError(
            f"setting {unknown[0]!r} does not apply to the uniform-state decoder {method!r} "
            f"(its settings: {', '.join(sorted(FIELDS - {'method'}))}{hint})",
            unknown[0],
        )
    given = {k for k, v in options.items() if v is not None}
    values = {**checkpoint_defaults(folder), **{k: v for k, v in options.items() if v is not None}}
    settings = DiffusionGemmaSettings(method=method, given=given, decoder_settings=own, **values)
    if settings.seed is None and not settings.sample:
        settings.seed = 0  # greedy is reproducible without a seed
    return settings


def _own_settings(method: str, options: dict):
    """The decoder's own settings popped from `options` (its OWNER key): a dict becomes the dataclass,
    a field it does not have refused by name; None when the decoder has none or none were given."""
    decoder = UNIFORM_DECODERS.get(method)
    if decoder is None or decoder.settings is None:
        return None
    cls = decoder.settings
    given = options.pop(cls.OWNER, None)
    if not isinstance(given, dict):
        return given
    names = cls.field_names()
    unknown = sorted(k for k in given if k not in names)
    if unknown:
        raise InputError(
            f"{cls.OWNER}.{unknown[0]} is not a setting of {method!r} (its settings: {', '.join(names)})",
            field=f"{cls.OWNER}.{unknown[0]}",
        )
    return cls(**given)


def uniform_settings_table() -> dict:
    """The uniform-state decoders' settings as `caidllm models` lists them: the knobs every one of them
    takes (flat names, their defaults) and each decoder's own settings (owner, fields, defaults, rules)."""
    defaults = DiffusionGemmaSettings()
    hidden = {"method", "given", "decoder_settings", "canvas_length"}
    shared = [
        {"name": f.name, "default": getattr(defaults, f.name)}
        for f in dataclasses.fields(DiffusionGemmaSettings)
        if f.name not in hidden
    ]
    own = []
    for method, decoder in UNIFORM_DECODERS.items():
        cls = decoder.settings
        if cls is None:
            continue
        values = cls()
        fields = [
            {"name": n, "default": getattr(values, n), "expected": r.expected if r else "checked"}
            for n in cls.field_names()
            for r in [cls.rule_for(n)]
        ]
        own.append({"owner": cls.OWNER, "title": cls.TITLE, "read_by": method, "fields": fields})
    return {"decoders": list(UNIFORM_METHODS), "shared": shared, "own": own}


def uniform_settings_lines() -> list[str]:
    table = uniform_settings_table()
    shared = ", ".join(f"{f['name']} ({f['default']!r})" for f in table["shared"])
    lines = [
        f"Uniform-state decoders' settings ({', '.join(table['decoders'])}; the flat name, --set NAME=VALUE; "
        "defaults: the checkpoint's generation_config.json where it sets them):",
        f"  {shared}",
    ]
    for entry in table["own"]:
        lines.append(f"  {entry['owner']}: {entry['title']} (read by decoder {entry['read_by']!r})")
        for f in entry["fields"]:
            dotted = f"{entry['owner']}.{f['name']}"
            lines.append(f"    {dotted:<30} default {f['default']!r}: {f['expected']}")
    return lines
