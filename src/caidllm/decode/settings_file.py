"""Settings files: a set of CAI settings saved by `caidllm calibrate`, read back
by generate(settings=...), build_config(settings=...), `caidllm generate /
bench / serve --settings FILE`.

    {"caidllm_settings": 1,
     "method": "cai",                      # the preset the values apply to (a `cai`-policy preset)
     "name": "cai-calibrated",             # the row name `caidllm bench` gives these settings
     "cai": {"theta_end": 0.6, ...},       # CAISettings fields, applied over the preset's
     "calibration": {...}}                 # how they were found (free-form, written by calibrate)

The values go on top of the preset and under any keyword the caller gives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from caidllm.decode.config import CAI_FIELDS
from caidllm.decode.methods import PRESETS, preset_config, uses_cai
from caidllm.errors import InputError

FORMAT_KEY = "caidllm_settings"
FORMAT_VERSION = 1
TOP_LEVEL = {FORMAT_KEY, "method", "name", "cai", "calibration"}
_TUPLE_FIELDS = ("factors", "budget_fractions")  # JSON lists, tuples in CAISettings


@dataclass
class CalibratedSettings:
    """The contents of a settings file: CAI values found by `caidllm calibrate` for one cai preset."""

    method: str = "cai"
    cai: dict = field(default_factory=dict)  # CAISettings field -> value
    name: str = "cai-calibrated"
    calibration: dict = field(default_factory=dict)
    source: str | None = None  # the file it was read from

    def to_dict(self) -> dict:
        return {FORMAT_KEY: FORMAT_VERSION, "method": self.method, "name": self.name,
                "cai": {k: list(v) if isinstance(v, tuple) else v for k, v in self.cai.items()},
                "calibration": self.calibration}

    def held_out_ids(self, task: str) -> set[str]:
        """Ids of the samples of `task` these settings were calibrated on (never to be evaluated)."""
        entry = (self.calibration.get("held_out") or {}).get(task)
        return set(entry.get("ids", [])) if isinstance(entry, dict) else set()

    def summary(self) -> dict:
        """What a report records about the settings that ran."""
        return {"source": self.source, "method": self.method, "name": self.name, "cai": self.to_dict()["cai"],
                "calibrated_on": self.calibration.get("tasks")}


def load_settings(settings) -> CalibratedSettings:
    """CalibratedSettings from a path (str / Path), a dict of the file's shape, or CalibratedSettings
    (returned as is)."""
    if isinstance(settings, CalibratedSettings):
        return settings
    if isinstance(settings, (str, Path)):
        return _from_dict(_read(Path(settings).expanduser()), str(settings))
    if isinstance(settings, dict):
        return _from_dict(settings, None)
    raise InputError(f"settings must be a settings file path, a dict or a CalibratedSettings, got {type(settings).__name__}")


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
        raise InputError(f"{where} is not a caidllm settings file (needs \"{FORMAT_KEY}\": {FORMAT_VERSION}; "
                         "write one with caidllm calibrate)")
    unknown = sorted(set(data) - TOP_LEVEL)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(sorted(TOP_LEVEL))}")
    method, name = data.get("method", "cai"), data.get("name", "cai-calibrated")
    for key, value in (("method", method), ("name", name)):
        if not isinstance(value, str) or not value:
            raise InputError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    cai = data.get("cai", {})
    if not isinstance(cai, dict):
        raise InputError(f"{where}: 'cai' must be an object of CAI settings, got {type(cai).__name__}")
    bad = sorted(set(cai) - CAI_FIELDS)
    if bad:
        raise InputError(f"{where}: unknown CAI setting(s) {', '.join(map(repr, bad))}; "
                         f"known: {', '.join(sorted(CAI_FIELDS))}")
    cai = {k: tuple(v) if k in _TUPLE_FIELDS and isinstance(v, list) else v for k, v in cai.items()}
    calibration = data.get("calibration", {})
    if not isinstance(calibration, dict):
        raise InputError(f"{where}: 'calibration' must be an object, got {type(calibration).__name__}")
    settings = CalibratedSettings(method=method, cai=cai, name=name, calibration=calibration, source=source)
    try:  # every value checked now, by the decoder's own validation
        if method not in PRESETS:
            raise InputError(f"unknown method {method!r}; choose one of {', '.join(PRESETS)}")
        if not uses_cai(method):
            raise InputError(f"the settings are CAI settings; method {method!r} does not run the CAI controller")
        preset_config(method, cai_under=cai)
    except InputError as error:
        raise InputError(f"{where}: {error}") from None
    return settings


Settings = CalibratedSettings  # the old name
