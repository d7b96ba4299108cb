"""Settings files: a method's settings, saved by `caidllm calibrate` (CAI's) or by hand, read back
by generate(settings=...), build_config(settings=...), `caidllm generate / bench / serve --settings FILE`.

    {"caidllm_settings": 1,
     "method": "cai",                      # the preset the values apply to
     "name": "cai-calibrated",             # the row name `caidllm bench` gives these settings
     "cai": {"theta_end": 0.6, ...},       # the method's settings under their owner's key (its policy's
                                           # or its cache's: "cai", "eb", "elastic", ...), over the preset's
     "calibration": {...}}                 # how they were found (free-form, written by calibrate)

The values go on top of the preset and under any keyword the caller gives. The keys a method takes
are read from its settings classes (decode/setting_names.py); a key of another method's is refused
in one line naming the methods that read it. A uniform-state decoder with settings of its own
(decode/uniform_decoders.py: "diffusiongemma-cai") is a method too: its values sit under its owner's key
("dgcai": {...}) and go over its defaults, under the caller's dgcai keyword.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from caidllm.decode.methods import PRESETS, preset_config, settings_classes
from caidllm.decode.setting_names import OWNERS, SETTINGS_CLASSES, owners_of, readers
from caidllm.decode.uniform_decoders import UNIFORM_DECODERS
from caidllm.errors import InputError

FORMAT_KEY = "caidllm_settings"
FORMAT_VERSION = 1
TOP_LEVEL = {FORMAT_KEY, "method", "name", "calibration"}
# The uniform-state decoders' own settings classes by owner key ("dgcai") -> (the decoder, the class).
UNIFORM_OWNERS = {d.settings.OWNER: (m, d.settings) for m, d in UNIFORM_DECODERS.items() if d.settings}
ALL_OWNERS = {**OWNERS, **{owner: cls for owner, (_, cls) in UNIFORM_OWNERS.items()}}


def _owners_of_method(method: str) -> set[str]:
    """The owner keys `method` (a mask-based preset or a uniform-state decoder) reads."""
    if method in UNIFORM_DECODERS:
        own = UNIFORM_DECODERS[method].settings
        return set() if own is None else {own.OWNER}
    return {cls.OWNER for cls in settings_classes(PRESETS[method]["policy"], PRESETS[method]["cache"])}


def _readers(owner: str) -> str:
    if owner in UNIFORM_OWNERS:
        return f"the uniform-state decoder {UNIFORM_OWNERS[owner][0]!r}"
    return readers(OWNERS[owner])


@dataclass
class CalibratedSettings:
    """The contents of a settings file: one method's settings (CAI's found by `caidllm calibrate`)."""

    method: str = "cai"
    values: dict = field(default_factory=dict)  # owner key ("cai") -> {field: value}
    name: str = "cai-calibrated"
    calibration: dict = field(default_factory=dict)
    source: str | None = None  # the file it was read from

    def to_dict(self) -> dict:
        return {
            FORMAT_KEY: FORMAT_VERSION,
            "method": self.method,
            "name": self.name,
            **{
                owner: {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
                for owner, values in self.values.items()
            },
            "calibration": self.calibration,
        }

    def check_applies(self, method: str) -> None:
        """InputError unless every owner key of the file is a settings class `method` runs."""
        own = _owners_of_method(method)
        for owner in self.values:
            if owner not in own:
                users = [m for m in (*PRESETS, *UNIFORM_DECODERS) if owner in _owners_of_method(m)]
                advice = f" (use {self.method!r})" if self.method != method else ""  # the file's own method
                where = f"settings {self.source}" if self.source else "settings"
                raise InputError(
                    f"the {where} hold {owner!r} settings, read only by {_readers(owner)} "
                    f"(methods: {', '.join(users)}); method {method!r} does not run "
                    f"them{advice}",
                    field="settings",
                )

    def held_out_ids(self, task: str) -> set[str]:
        """Ids of the samples of `task` these settings were calibrated on (never to be evaluated)."""
        entry = (self.calibration.get("held_out") or {}).get(task)
        return set(entry.get("ids", [])) if isinstance(entry, dict) else set()

    def summary(self) -> dict:
        """What a report records about the settings that ran."""
        own = {owner: value for owner, value in self.to_dict().items() if owner in self.values}
        return {
            "source": self.source,
            "method": self.method,
            "name": self.name,
            **own,
            "calibrated_on": self.calibration.get("tasks"),
        }


def load_settings(settings) -> CalibratedSettings:
    """CalibratedSettings from a path (str / Path), a dict of the file's shape, or CalibratedSettings
    (returned as is)."""
    if isinstance(settings, CalibratedSettings):
        return settings
    if isinstance(settings, (str, Path)):
        return _from_dict(_read(Path(settings).expanduser()), str(settings))
    if isinstance(settings, dict):
        return _from_dict(settings, None)
    raise InputError(
        "settings must be a settings file path, a dict or a CalibratedSettings, got "
        f"{type(settings).__name__}"
    )


def write_settings(path, settings: CalibratedSettings) -> None:
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write the settings file {path}: {e.strerror or e}") from None


def _read(path: Path) -> dict:
    if not path.exists():
        raise InputError(f"settings file {path} does not exist")
    if not path.is_file():
        raise InputError(f"settings file {path} is not a file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read settings file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"settings file {path} line {e.lineno} is not valid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise InputError(f"settings file {path} must hold a JSON object, got a {type(data).__name__}")
    return data


def _from_dict(data: dict, source: str | None) -> CalibratedSettings:
    where = f"settings file {source}" if source else "settings"
    if data.get(FORMAT_KEY) != FORMAT_VERSION:
        raise InputError(
            f'{where} is not a caidllm settings file (needs "{FORMAT_KEY}": {FORMAT_VERSION}; '
            "write one with caidllm calibrate)"
        )
    unknown = sorted(set(data) - TOP_LEVEL - set(ALL_OWNERS))
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(TOP_LEVEL | set(ALL_OWNERS)))}{_owned_setting(unknown[0])}"
        )
    method = data.get("method", "cai")
    own = getattr(
        UNIFORM_DECODERS.get(method), "settings", None
    )  # a uniform-state decoder's: dgcai-calibrated
    name = data.get("name", f"{own.OWNER}-calibrated" if own is not None else "cai-calibrated")
    for key, value in (("method", method), ("name", name)):
        if not isinstance(value, str) or not value:
            raise InputError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    values = {owner: data[owner] for owner in ALL_OWNERS if owner in data}
    for owner, given in values.items():
        cls = ALL_OWNERS[owner]
        if not isinstance(given, dict):
            raise InputError(
                f"{where}: {owner!r} must be an object of {cls.TITLE} settings, got {type(given).__name__}"
            )
        bad = sorted(set(given) - set(cls.field_names()))
        if bad:
            raise InputError(
                f"{where}: unknown {owner} setting(s) {', '.join(map(repr, bad))}; "
                f"known: {', '.join(sorted(cls.field_names()))}{_owned_elsewhere(bad[0])}"
            )
        defaults = cls()  # JSON lists where the field is a tuple: tuples, as the dataclass holds them
        values[owner] = {
            k: tuple(v) if isinstance(v, list) and isinstance(getattr(defaults, k), tuple) else v
            for k, v in given.items()
        }
    calibration = data.get("calibration", {})
    if not isinstance(calibration, dict):
        raise InputError(f"{where}: 'calibration' must be an object, got {type(calibration).__name__}")
    settings = CalibratedSettings(
        method=method, values=values, name=name, calibration=calibration, source=source
    )
    try:  # every value checked now, by the decoder's own validation
        if method not in PRESETS and method not in UNIFORM_DECODERS:
            raise InputError(
                f"unknown method {method!r}; choose one of {', '.join([*PRESETS, *UNIFORM_DECODERS])}"
            )
        settings.check_applies(method)
        if method in UNIFORM_DECODERS:
            for owner, given in values.items():
                ALL_OWNERS[owner](**given).validate()
        else:
            preset_config(method, file_values=values)
    except InputError as error:
        raise InputError(f"{where}: {error}") from None
    return settings


def _owned_setting(name: str) -> str:
    """ " (a setting of ...: write it under its owner's key)" when the top-level key `name` is a method's
    setting by its flat name (`eb_gamma`) or dotted one ("eb.gamma"): who reads it, and where it goes."""
    owners = owners_of(name)
    if not owners or name in OWNERS:
        return ""

    def nested(cls) -> str:
        field_name = name.split(".", 1)[1] if "." in name else cls.LEGACY[name]
        return json.dumps({cls.OWNER: {field_name: None}}).replace("null", "...")

    return (
        f" ({name!r} is a setting of {' or '.join(readers(cls) for cls in owners)}: a settings file "
        f"holds it under its owner's key, {' or '.join(nested(cls) for cls in owners)})"
    )


def _owned_elsewhere(name: str) -> str:
    """ " (a setting of ...)" when `name` is another settings class's field: who reads it."""
    owners = [cls for cls in SETTINGS_CLASSES if name in cls.field_names()]
    return f" ({name!r} is a setting of {' or '.join(readers(cls) for cls in owners)})" if owners else ""
