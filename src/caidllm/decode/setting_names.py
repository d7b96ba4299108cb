"""Which method owns which setting name, read from the methods' declarations (the settings classes the
policy and cache registries name): nothing here lists a method's fields.

A caller names a method's setting by its owner's key and field (a body's {"eb": {"gamma": 0.02}},
the dotted "eb.gamma") or by a flat name of earlier versions (`eb_gamma`, each class's LEGACY);
`split` routes a set of keyword values to the shared fields, the policy's settings and the cache's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from caidllm.decode import forward_modes, policies
from caidllm.decode.config import SHARED_FIELDS, SHARED_RULE
from caidllm.errors import InputError
from caidllm.setting_rules import MethodSettings, Rule


def _settings_classes() -> dict[type[MethodSettings], tuple[list[str], list[str]]]:
    """Every settings class with fields -> (the policies, the cache modes) that use it."""
    found: dict = {}
    for name, spec in policies.POLICIES.items():
        found.setdefault(spec.settings_type, ([], []))[0].append(name)
    for name, mode in forward_modes.CACHE_MODES.items():
        found.setdefault(mode.settings_type, ([], []))[1].append(name)
    return {cls: users for cls, users in found.items() if cls.OWNER}


SETTINGS_CLASSES = _settings_classes()
OWNERS = {cls.OWNER: cls for cls in SETTINGS_CLASSES}
# A flat name (earlier versions') -> the classes that take it ("threshold": several policies').
FLAT_NAMES: dict[str, list[type[MethodSettings]]] = {}
for _cls in SETTINGS_CLASSES:
    for _name in _cls.LEGACY:
        FLAT_NAMES.setdefault(_name, []).append(_cls)
# Every name a caller may give a decoder: the shared fields, the owners' keys and the flat names.
ALL_NAMES = frozenset({*SHARED_FIELDS, *OWNERS, *FLAT_NAMES})


def readers(cls: type[MethodSettings]) -> str:
    """Who reads the class's settings: "policy 'eb'", "cache 'elastic'"."""
    used_by, cached_by = SETTINGS_CLASSES[cls]
    return " or ".join([*(f"policy {p!r}" for p in used_by), *(f"cache {c!r}" for c in cached_by)])


def owners_of(name: str) -> list[type[MethodSettings]]:
    """The classes that declare `name` (an owner's key, a dotted name or a flat one)."""
    if name in OWNERS:
        return [OWNERS[name]]
    if "." in name:
        cls = OWNERS.get(name.split(".", 1)[0])
        return [cls] if cls is not None and name.split(".", 1)[1] in cls.field_names() else []
    return FLAT_NAMES.get(name, [])


def rules_of(name: str) -> list[Rule]:
    """The field rules a name given is checked by (a shared field's; an owner's key: all its fields')."""
    if name in SHARED_RULE:
        return [SHARED_RULE[name]]
    if name in OWNERS:
        return list(OWNERS[name].RULES)
    field_of = (lambda cls: name.split(".", 1)[1]) if "." in name else (lambda cls: cls.LEGACY[name])
    return [rule for cls in owners_of(name) if (rule := cls.rule_for(field_of(cls))) is not None]


@dataclass
class Split:
    """Keyword values routed (split): the shared fields', the policy's and the cache's, the dotted names
    given and the names they were given under, and the names no chosen method reads."""

    shared: dict = field(default_factory=dict)
    policy: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)
    given: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)


def split(values: dict, policy_cls, cache_cls, counted: bool = True, into: Split | None = None) -> Split:
    """Route `values` (keyword -> value; None values skipped) to `policy_cls`'s and `cache_cls`'s settings
    and the shared fields. counted: they are the caller's (recorded as given). A name of another method
    goes to `foreign` after its value is checked by its owner's rules; an unknown name is refused."""
    out = into or Split()
    for key, value in values.items():
        if value is None:
            continue
        if key in SHARED_FIELDS:
            out.shared[key] = value
            out.given += [key] if counted else []
            continue
        for cls, target in ((policy_cls, out.policy), (cache_cls, out.cache)):
            if cls.OWNER and key == cls.OWNER:
                _nested(cls, value, target, out, counted)
                break
            if key in cls.LEGACY:
                target[cls.LEGACY[key]] = value
                if counted:
                    out.labels[f"{cls.OWNER}.{cls.LEGACY[key]}"] = key
                    out.given.append(f"{cls.OWNER}.{cls.LEGACY[key]}")
                break
        else:
            _foreign(key, value)
            out.foreign += [key] if counted else []
    return out


def _owner_object(cls, value) -> dict:
    """`value` given under `cls`'s owner key: an object of its fields, else InputError naming the key."""
    if not isinstance(value, dict):
        raise InputError(
            f"{cls.OWNER} must be an object of {cls.TITLE} settings, got {type(value).__name__}",
            field=cls.OWNER,
        )
    unknown = [name for name in value if name not in cls.field_names()]
    if unknown:
        known = ", ".join(sorted(cls.field_names()))
        raise InputError(f"unknown {cls.OWNER} setting {unknown[0]!r}; known: {known}", field=cls.OWNER)
    return value


def _nested(cls, value, target: dict, out: Split, counted: bool) -> None:
    for name, item in _owner_object(cls, value).items():
        target[name] = item
        if counted:
            out.labels[f"{cls.OWNER}.{name}"] = cls.OWNER
            out.given.append(f"{cls.OWNER}.{name}")


def _foreign(key: str, value) -> None:
    """A name no chosen method reads: refused when unknown, else its value checked by its owner's rules."""
    owners = owners_of(key)
    if not owners:
        known = sorted(ALL_NAMES - {"policy", "cache"})
        raise InputError(f"unknown decoding option {key!r}; known: {', '.join(known)}", field=key)
    cls = owners[0]
    settings = cls()
    if key == cls.OWNER:
        for name, item in _owner_object(cls, value).items():
            setattr(settings, name, item)
        settings.check({f"{key}.{name}": key for name in value})
    else:
        setattr(settings, cls.LEGACY[key], value)
        settings.check({f"{cls.OWNER}.{cls.LEGACY[key]}": key})


def not_read(name: str, config, methods: list[str]) -> InputError:
    """The refusal of a setting `name` the config's policy and cache do not read: one line naming who does."""
    owners = owners_of(name)
    who = " or ".join(readers(cls) for cls in owners)
    return InputError(
        f"{name} does not apply to method {config.method!r} (policy {config.policy!r}, cache "
        f"{config.cache!r}): it is read only by {who} (methods: {', '.join(methods)})",
        field=name,
    )


def settings_table() -> list[dict]:
    """Every method's settings as `caidllm models` and the docs list them, read from the declarations:
    owner key, title, who reads them, and each field's default, rule, flat name and models."""
    table = []
    for cls in SETTINGS_CLASSES:
        defaults = cls()
        fields = [
            {
                "name": name,
                "default": getattr(defaults, name),
                "flat": cls.flat_name(name),
                "expected": rule.expected if rule and rule.expected else "checked by its normaliser",
                "models": rule.models if rule else None,
            }
            for name in cls.field_names()
            for rule in [cls.rule_for(name)]
        ]
        table.append({"owner": cls.OWNER, "title": cls.TITLE, "read_by": readers(cls), "fields": fields})
    return table


def settings_lines() -> list[str]:
    """settings_table as text: one line per owner, one per field."""
    lines = [
        "Method settings (a body's / settings file's {\"OWNER\": {...}}, --set OWNER.FIELD=VALUE, or the "
        "flat name):"
    ]
    for entry in settings_table():
        lines.append(f"  {entry['owner']}: {entry['title']} (read by {entry['read_by']})")
        for f in entry["fields"]:
            models = f" ({f['models']} models only)" if f["models"] else ""
            dotted = f"{entry['owner']}.{f['name']}"
            lines.append(
                f"    {dotted:<26} {f['flat']:<20} default {f['default']!r}: {f['expected']}{models}"
            )
    return lines
