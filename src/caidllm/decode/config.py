"""Plain dataclasses holding the decoder's settings.

`DecodeConfig` is what the engine reads: what every method shares (lengths, steps, temperature,
seed, the method, policy and cache names) and the chosen policy's and cache mode's own settings
objects, each declared next to its method's code (policies/*.py, the cache modes' modules: their
fields, rules and flat names of earlier versions, setting_rules.MethodSettings). Presets
(methods.py) are named sets of overrides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from caidllm.checks import is_int, is_number
from caidllm.decode import forward_modes, policies
from caidllm.errors import InputError
from caidllm.setting_rules import (
    BLOCK_CAUSAL,
    FULL_SEQUENCE,
    CacheSettings,
    MethodSettings,
    Rule,
    boolean,
    non_negative,
    non_negative_int,
    positive_int,
)

# The valid values, read from their registries: cache modes (decode/forward_modes.py) and commit
# policies (decode/policies/).
CACHE_MODES = tuple(forward_modes.CACHE_MODES)
POLICIES = tuple(policies.POLICIES)


@dataclass
class DecodeConfig:
    method: str = "cai"
    policy: str = "cai"  # a key of policies.POLICIES
    gen_length: int = 256
    block_length: int = 64
    # Total denoising steps over the whole generation (LLaDA's convention); each
    # block gets steps // num_blocks, the T of the paper. None = gen_length.
    steps: int | None = None
    cache: str = "dual"  # a key of forward_modes.CACHE_MODES
    refresh_every: int | None = (
        None  # f: full refresh every f steps in a block; None = model default, 0 = block starts only
    )
    # Block-causal models' token editing (decode/block_diffusion.py, LLaDA2.1's): None = off; max_post_steps
    # bounds the editing steps once a block has no mask left.
    editing_threshold: float | None = None
    max_post_steps: int = 16
    temperature: float = 0.0
    seed: int | None = None
    early_stop: bool = True
    # The policy's and the cache mode's own settings (their registries name the class); None: the defaults.
    policy_settings: MethodSettings | None = None
    cache_settings: CacheSettings | None = None
    # The settings the caller set (build_config fills it; a method's by their dotted names, "eb.gamma"): on
    # a model family a setting does not apply to, a given one is refused, a preset's default is replaced by
    # the family's (decode/block_diffusion.py). None (a DecodeConfig built by hand): every shared field
    # whose value differs from its default.
    given: tuple[str, ...] | None = None
    # Dotted name -> the name the caller gave it under (a flat name of earlier versions, `eb_gamma`), so
    # an error names the field as the caller wrote it.
    labels: dict[str, str] = field(default_factory=dict)
    # Names the caller gave that neither the policy nor the cache reads (kept out: build_config's lenient
    # default); a strict check (block_diffusion.fit_to_model) refuses them, naming their owner.
    foreign: tuple[str, ...] = ()
    # The model traits it was fitted to (block_diffusion.fit_to_model): fitted once per request.
    # A copy made with dataclasses.replace is fitted anew; a fitted config's fields are not edited in place.
    fitted_to: tuple | None = field(default=None, compare=False, init=False)
    # The policy's registry entry, resolved once (None for an unknown policy, which validate refuses).
    policy_spec: policies.PolicySpec | None = field(default=None, compare=False, init=False, repr=False)

    def __post_init__(self):
        self.policy_spec = _entry(policies.POLICIES, self.policy)
        self.policy_settings = _settings_of(self.policy_settings, self.policy_spec)
        self.cache_settings = _settings_of(self.cache_settings, _entry(forward_modes.CACHE_MODES, self.cache))
        if self.given is None:
            self.given = _set_by_hand(self)

    @property
    def whole_generation(self) -> bool:
        """Whether the cache decodes the whole generation as one block (Elastic-Cache's official loop)."""
        return self.cache_settings is not None and self.cache_settings.whole_generation

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        total = self.gen_length if self.steps is None else self.steps
        return self.policy_settings.limit_steps(total // self.num_blocks, self)

    def validate(self) -> DecodeConfig:
        """Raise InputError naming the first invalid value (the shared rules and the method's, in order)."""
        # the registries as they are now (a decoder added since)
        _choice(self, "policy", tuple(policies.POLICIES))
        _choice(self, "cache", tuple(forward_modes.CACHE_MODES))
        self.__post_init__()  # a policy or cache set in place since: its own settings class (its defaults)
        SHARED_RULES[0].check(self, "gen_length")
        self.cache_settings.check(self.labels)
        self.cache_settings.settle_lengths(self)  # Elastic-Cache's one block, before the lengths are checked
        for rule in SHARED_RULES[1:3]:
            rule.check(self, rule.field)
        _whole_blocks(self)
        self.policy_settings.check(self.labels)
        _steps_per_block(self)
        for rule in SHARED_RULES[3:]:
            rule.check(self, rule.field)
        self.policy_settings.check_with(self)
        self.cache_settings.check_with(self)
        return self


def _entry(registry: dict, name):
    """The registry's entry of `name` (None for a name it lacks, or not a string: validate refuses both)."""
    return registry.get(name) if isinstance(name, str) else None


def _settings_of(settings, spec):
    """The settings object a config holds for its policy or cache `spec` (None: an unknown name, which
    validate refuses): the given one when it is of the method's class, else the class's defaults."""
    if spec is None:
        return settings
    wanted = spec.settings_type
    return settings if type(settings) is wanted else wanted()


def _set_by_hand(config: DecodeConfig) -> tuple[str, ...]:
    """The settings of a hand-built config that differ from their defaults (a method's by their dotted
    names): a value equal to its default cannot be told from one left out."""
    shared = [
        name
        for name in SHARED_FIELDS
        if getattr(config, name) != DecodeConfig.__dataclass_fields__[name].default
    ]
    own = []
    for settings in (config.policy_settings, config.cache_settings):
        if settings is None:
            continue
        default = type(settings)()
        own += [
            f"{settings.OWNER}.{f.name}"
            for f in dataclasses.fields(settings)
            if getattr(settings, f.name) != getattr(default, f.name)
        ]
    return tuple(sorted([*shared, *own]))


def _choice(config: DecodeConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if not isinstance(value, str) or value not in choices:
        what = "cache mode" if name == "cache" else name
        raise InputError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}", field=name)


def _whole_blocks(config: DecodeConfig) -> None:
    if config.gen_length % config.block_length:
        raise InputError(
            f"gen_length ({config.gen_length}) must be a multiple of block_length ({config.block_length})",
            field="gen_length",
        )


def _steps_per_block(config: DecodeConfig) -> None:
    if config.steps is not None and config.steps % config.num_blocks:
        raise InputError(
            f"steps ({config.steps}) must be a multiple of the number of blocks "
            f"({config.num_blocks} = gen_length {config.gen_length} / block_length {config.block_length})",
            field="steps",
        )
    if config.steps_per_block < 1:
        raise InputError(f"steps per block must be at least 1, got {config.steps_per_block}", field="steps")


# The fields every method shares, checked in this order (validate: gen_length, then the block length and
# steps, then the rest); `models` says which kind of model reads one (block_diffusion.check_given_fit).
SHARED_RULES: tuple[Rule, ...] = (
    Rule("gen_length", "a positive integer", positive_int),
    Rule("block_length", "a positive integer", positive_int),
    Rule("steps", "a positive integer or None", lambda v: v is None or positive_int(v)),
    Rule(
        "editing_threshold",
        "in [0, 1] (or None: no editing)",
        lambda v: v is None or (is_number(v) and 0 <= v <= 1),
        models=BLOCK_CAUSAL,
        about="LLaDA2.1 token editing",
    ),
    Rule(
        "max_post_steps",
        "an integer >= 0",
        non_negative_int,
        models=BLOCK_CAUSAL,
        about="LLaDA2.1 token editing",
    ),
    Rule(
        "refresh_every",
        "an integer >= 0 (0 = block starts only)",
        lambda v: v is None or (is_int(v) and v >= 0),
        models=FULL_SEQUENCE,
        about="its block cache is exact, never refreshed",
    ),
    Rule("temperature", "a finite number >= 0", non_negative),
    Rule("seed", "an integer or None", lambda v: v is None or is_int(v)),
    Rule("early_stop", "True or False", boolean),
)
SHARED_FIELDS = ("policy", "cache", *(rule.field for rule in SHARED_RULES))
SHARED_RULE = {rule.field: rule for rule in SHARED_RULES}
