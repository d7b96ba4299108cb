"""How a method declares its settings: a dataclass of its fields (policies/*.py, the cache modes'
modules), each field checked by a Rule, and the hooks the engine's shared code asks of any method.

A method's settings class derives from MethodSettings and states, next to the method's code:
OWNER (the key its fields go under: a request body's {"eb": {"gamma": 0.02}}, a message's
"eb.gamma"), LEGACY (the flat names earlier versions took, `eb_gamma`, that keep working: the
method's own mapping), RULES (each field's type and range, and which models it applies to), and
`check_with` for rules that read other settings. The CLI, the server, settings files and the
reports read these declarations; nothing else lists a method's fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from caidllm.checks import is_int, is_number
from caidllm.errors import InputError

FULL_SEQUENCE = "full-sequence"  # bidirectional attention (LLaDA, Dream)
BLOCK_CAUSAL = "block-causal"  # block diffusion (LLaDA2.x, SDAR, tiny-bd)


@dataclass(frozen=True)
class Rule:
    """One field's check: `ok(value)` or the error "<label> must be <expected>, got <value>".
    `normalise` (instead of `ok`) returns the value to keep, raising its own error.
    models: the only kind of model (FULL_SEQUENCE or BLOCK_CAUSAL) that reads the field, None: any;
    about: what the field is, said when a model of the other kind refuses it."""

    field: str
    expected: str = ""
    ok: Callable[[object], bool] | None = None
    normalise: Callable[[object, str], object] | None = None
    models: str | None = None
    about: str = ""

    def check(self, owner, label: str, given_as: str | None = None) -> None:
        """Check (or normalise) `owner`'s field; the error says `label` and carries `given_as`."""
        value = getattr(owner, self.field)
        if self.normalise is not None:
            try:
                setattr(owner, self.field, self.normalise(value, label))
            except InputError as error:
                raise InputError(str(error), field=given_as or label) from None
        elif not self.ok(value):
            raise InputError(f"{label} must be {self.expected}, got {value!r}", field=given_as or label)


def positive_int(v) -> bool:
    return is_int(v) and v >= 1


def non_negative_int(v) -> bool:
    return is_int(v) and v >= 0


def unit_interval(v) -> bool:
    return is_number(v) and 0 < v <= 1


def non_negative(v) -> bool:
    return is_number(v) and v >= 0


def boolean(v) -> bool:
    return isinstance(v, bool)


UNIT_INTERVAL = "in (0, 1]"


def named(labels: dict[str, str], dotted: str) -> tuple[str, str]:
    """How an error says the method's setting `dotted` ("wino.draft"), and the field it is about: a flat
    name of earlier versions as the caller gave it (`wino_draft`), else the dotted name, about the key
    the caller gave it under (the owner's, "wino"; the dotted name where the caller gave none)."""
    owner, _, field = dotted.partition(".")
    given_as = labels.get(dotted)
    return (dotted if given_as in (None, owner, field) else given_as), given_as or dotted


def chosen_by(config, name: str) -> str:
    """The field an error about the request's `name` ("cache", "policy") is about: `name` where the
    caller gave it, else the method that chose it."""
    return name if name in config.given else "method"


def choice_rule(name: str, choices: tuple[str, ...], **kwargs) -> Rule:
    return Rule(name, f"one of {', '.join(choices)}", lambda v: v in choices, **kwargs)


class MethodSettings:
    """The base of a method's settings dataclass (see the module's docstring); its hooks default to
    a method that needs none of them."""

    OWNER: ClassVar[str] = ""
    LEGACY: ClassVar[dict[str, str]] = {}
    RULES: ClassVar[tuple[Rule, ...]] = ()
    # What the fields are about, for the reports and `caidllm models` (the method's name and paper).
    TITLE: ClassVar[str] = ""

    def check_with(self, config) -> None:
        """Rules that read the request's other settings (a DecodeConfig); InputError naming the field."""

    def refuse_unread(self, config) -> None:
        """InputError naming a setting the caller gave (config.given) that this method does not read in
        the mode it runs in (CAI's fixed threshold under its adaptive schedule)."""

    def settle_lengths(self, config) -> None:
        """Set the request's lengths this method decides (before the lengths are checked together)."""

    def limit_steps(self, per_block: int, config) -> int:
        """The steps per block this method takes of the `per_block` the lengths give."""
        return per_block

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def rule_for(cls, name: str) -> Rule | None:
        return next((rule for rule in cls.RULES if rule.field == name), None)

    @classmethod
    def flat_name(cls, name: str) -> str:
        """The flat (LEGACY) name of field `name`, else its dotted one (OWNER.name)."""
        return next((old for old, new in cls.LEGACY.items() if new == name), f"{cls.OWNER}.{name}")

    def check(self, labels: dict[str, str]) -> None:
        """Every field rule, in order; `labels`: dotted name -> the name the caller gave it under."""
        for rule in self.RULES:
            label, field = named(labels, f"{self.OWNER}.{rule.field}")
            rule.check(self, label, field)


class CacheSettings(MethodSettings):
    """A cache mode's settings (forward_modes.CACHE_MODES names the class of each)."""

    @property
    def whole_generation(self) -> bool:
        """Whether the request decodes its whole generation as one block (Elastic-Cache's official loop)."""
        return False


@dataclass
class NoCacheSettings(CacheSettings):
    """A cache mode with no settings of its own."""
