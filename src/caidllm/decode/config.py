"""Plain dataclasses holding every knob of the decoder.

`DecodeConfig` is what the engine reads; `CAISettings` groups the CAI-dLLM
controller's constants (paper Boxes 3-7 and DESIGN.md's readings of them).
Presets (presets.py) are just named sets of overrides of these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

from caidllm.checks import are_numbers, is_int, is_number
from caidllm.decode import forward_modes, policies
from caidllm.decode.policies.cai import CAISettings  # the CAI controller's constants live with it
from caidllm.errors import InputError
from caidllm.models.skip import DEFAULT_ALPHA, DEFAULT_SCHEDULE, check_alpha, check_schedule

# The valid values, read from their registries: cache modes (decode/forward_modes.py; "es" is the dual
# cache with ES-dLLM early skipping, models/skip.py) and commit policies (decode/policies/).
CACHE_MODES = tuple(forward_modes.CACHE_MODES)
POLICIES = tuple(policies.POLICIES)
# What the CAI controller does after K low-yield steps (Box 7): "continue" commits the masked tokens above the
# fallback threshold and goes on; "exit" ends the block, committing every still-masked position with its
# current prediction in that same step (Algorithm 1's `break`, without leaving a mask behind).
# EB-Sampler's error proxies (policies/eb.py).
EB_PROXIES = policies.eb.PROXIES
GRINDING_ACTIONS = ("continue", "exit")
ELASTIC_SCOPES = ("generation", "block")  # decode/elastic.py


@dataclass
class DecodeConfig:
    method: str = "cai"
    policy: str = "cai"  # vanilla | threshold | cai
    gen_length: int = 256
    block_length: int = 64
    # Total denoising steps over the whole generation (LLaDA's convention); each
    # block gets steps // num_blocks, the T of the paper. None = gen_length.
    steps: int | None = None
    cache: str = "dual"  # none | prefix | dual | es
    refresh_every: int | None = None  # f: full refresh every f steps in a block; None = model default, 0 = block starts only
    # Early skipping (cache="es" only): (keep fraction, group start as a fraction of depth) pairs, and the
    # weight of the previous-step confidence against the hidden-state drift in the importance score.
    es_schedule: tuple[tuple[float, float], ...] = DEFAULT_SCHEDULE
    es_alpha: float = DEFAULT_ALPHA
    threshold: float = 0.9  # Fast-dLLM threshold rule, and CAI's fixed threshold when adaptive=False
    # Block-diffusion decoders ("dynamic", "static"): LLaDA2's minimal_topk caps the steps of a block at
    # gen_length // minimal_topk (its official reading).
    minimal_topk: int = 1
    # "dynamic" with a fixed quota per step (LLaDA2.1's num_to_transfer) instead of the schedule; None = schedule.
    num_to_transfer: int | None = None
    # LLaDA2.1 token editing (decode/block_diffusion.py): None = off; max_post_steps bounds the editing
    # steps once a block has no mask left.
    editing_threshold: float | None = None
    max_post_steps: int = 16
    # Fast-dLLM v2 (policy "subblock", cache "subblock"): the sub-block length, which must divide the block.
    sub_block: int = 8
    factor: float | None = None  # Fast-dLLM factor rule instead of the threshold rule
    # EB-Sampler (policies/eb.py): the error budget gamma of a step and the error proxy.
    eb_gamma: float = 0.01
    eb_proxy: str = "entropy"
    # SlowFast Sampling (policies/slowfast.py): exploratory steps per sub-cycle, the certainty
    # threshold that marks the cycle's reach, the convergence window and its std bound, and the
    # high-confidence threshold of the accelerated phase.
    sf_explore_steps: int = 6
    sf_cycle_threshold: float = 0.3
    sf_window: int = 2
    sf_std: float = 1.0
    sf_high: float = 0.9
    sf_shortened: bool = True  # the official fast phase: forwards after its first end at the span's end
    # WINO (policies/wino.py): draft (wide-in) and verify (narrow-out) thresholds, and the most
    # steps a block may take (re-masking can undo progress; past it the rest is committed).
    wino_draft: float = 0.6
    wino_verify: float = 0.9
    wino_max_steps: int = 256
    # Elastic-Cache (cache="elastic", decode/elastic.py): the drift test's cosine threshold, the sliding
    # window (None: 16, cut to the block), the shallowest layer the drift test runs at (0: every layer, as
    # the official), the most-attended keys tracked per layer (the official track_num), and where the
    # window slides: "generation" (the official: over the whole generation, one block of gen_length) or
    # "block" (caidllm's reading: inside each block, every block starting with a whole forward).
    elastic_gamma: float = 0.9
    elastic_window: int | None = None
    elastic_layer: int = 0
    elastic_track: int = 1
    elastic_scope: str = "generation"
    # dKV-Cache-Greedy (cache="dkv-greedy"): masked neighbours computed around each position a step decodes.
    dkv_window: int = 0
    temperature: float = 0.0
    seed: int | None = None
    early_stop: bool = True
    cai: CAISettings = field(default_factory=CAISettings)
    # The fields the caller set (build_config fills it): on a model family a setting does not apply to,
    # a given one is refused, a preset's default is replaced by the family's (decode/block_diffusion.py).
    # None (a DecodeConfig built by hand): every field whose value differs from its default.
    given: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.given is None:
            self.given = _set_by_hand(self)

    @property
    def whole_generation(self) -> bool:
        """Elastic-Cache's official loop: one block of gen_length, its window sliding over the whole generation."""
        return self.cache == "elastic" and self.elastic_scope == "generation"

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        total = self.gen_length if self.steps is None else self.steps
        per_block = total // self.num_blocks
        if self.policy in ("dynamic", "static"):  # LLaDA2: steps = min(steps, gen_length // minimal_topk)
            per_block = min(per_block, self.gen_length // self.minimal_topk)
        return per_block

    def validate(self) -> "DecodeConfig":
        """Raise InputError naming the first invalid value (the rules of VALIDATION, in order)."""
        for rule in VALIDATION:
            rule(self)
        return self


def _set_by_hand(config: DecodeConfig) -> tuple[str, ...]:
    """The settings of a hand-built config that differ from their defaults (CAI's by their own names,
    as build_config names them): a value equal to its default cannot be told from one left out."""
    default_cai = CAISettings()
    top = (f.name for f in fields(config) if f.name not in ("method", "cai", "given")
           and getattr(config, f.name) != f.default)
    cai = (f.name for f in fields(config.cai) if getattr(config.cai, f.name) != getattr(default_cai, f.name))
    return tuple(sorted([*top, *cai]))


@dataclass(frozen=True)
class FieldRule:
    """One field's check: `ok(value)` or the error "<label> must be <expected>, got <value>".
    `normalise` (instead of `ok`) returns the value to keep, raising its own error."""

    field: str  # a DecodeConfig field, or "cai.<name>" for a CAISettings field
    expected: str = ""
    ok: Callable[[object], bool] | None = None
    normalise: Callable[[object, str], object] | None = None

    def __call__(self, config: "DecodeConfig") -> None:
        owner, name = (config.cai, self.field[4:]) if self.field.startswith("cai.") else (config, self.field)
        value = getattr(owner, name)
        if self.normalise is not None:
            setattr(owner, name, self.normalise(value, self.field))
        elif not self.ok(value):
            raise InputError(f"{self.field} must be {self.expected}, got {value!r}")


def _choice(field_name: str, what: str, choices: tuple[str, ...]) -> Callable[["DecodeConfig"], None]:
    def check(config: "DecodeConfig") -> None:
        value = getattr(config, field_name)
        if value not in choices:
            raise InputError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
    return check


def _whole_blocks(config: "DecodeConfig") -> None:
    if config.gen_length % config.block_length:
        raise InputError(f"gen_length ({config.gen_length}) must be a multiple of block_length ({config.block_length})")


def _steps_per_block(config: "DecodeConfig") -> None:
    if config.steps is not None and config.steps % config.num_blocks:
        raise InputError(
            f"steps ({config.steps}) must be a multiple of the number of blocks "
            f"({config.num_blocks} = gen_length {config.gen_length} / block_length {config.block_length})")
    if config.steps_per_block < 1:
        raise InputError(f"steps per block must be at least 1, got {config.steps_per_block}")


def _clips_ordered(config: "DecodeConfig") -> None:
    c = config.cai
    if c.clip_low > c.clip_high:
        raise InputError(f"cai.clip_low ({c.clip_low}) must not exceed cai.clip_high ({c.clip_high})")


def _window_fits_the_block(config: "DecodeConfig") -> None:
    if config.policy == "slowfast" and config.sf_window > config.block_length:
        raise InputError(f"sf_window ({config.sf_window}) is longer than the block ({config.block_length})")


def _wino_thresholds_ordered(config: "DecodeConfig") -> None:
    if config.wino_draft > config.wino_verify:
        raise InputError(f"WINO thresholds out of order: wino_draft ({config.wino_draft}) must not exceed "
                         f"wino_verify ({config.wino_verify}) (draft wide, verify narrow)")


def _elastic_window_fits(config: "DecodeConfig") -> None:
    if config.cache != "elastic" or (config.elastic_window or 0) <= config.block_length:
        return
    if config.elastic_scope == "generation":
        raise InputError(f"elastic_window ({config.elastic_window}) is longer than the generation "
                         f"(gen_length {config.gen_length})")
    raise InputError(f"elastic_window ({config.elastic_window}) is longer than the block ({config.block_length})")


def _elastic_one_block(config: "DecodeConfig") -> None:
    """Elastic-Cache over the whole generation (the official loop) is one block of gen_length. A block
    length the caller gave that differs is refused, never silently replaced (a default, or a length a
    run shares with block-wise methods, is not given: presets.lays_blocks)."""
    if not (config.whole_generation and is_int(config.gen_length)):
        return
    bl = config.block_length
    if "block_length" in config.given and not _positive_int(bl):
        return  # the next rule names it
    if "block_length" in config.given and bl != config.gen_length:
        raise InputError(
            f"block_length {bl} does not apply to method {config.method!r}: Elastic-Cache's official loop "
            f"(cache 'elastic', elastic_scope 'generation') decodes the whole generation (gen_length "
            f"{config.gen_length}) as one block with its own sliding window; drop block_length, or use method "
            f"'elastic-block' (elastic_scope='block') for blocks of {bl}")
    config.block_length = config.gen_length


def _elastic_refreshes_adaptively(config: "DecodeConfig") -> None:
    if config.cache == "elastic" and config.refresh_every:
        raise InputError(f"cache 'elastic' with refresh_every={config.refresh_every} is not meaningful: "
                         "Elastic-Cache refreshes when its drift test says so (use refresh_every=0)")
    if config.cache == "elastic" and config.policy == "cai" and config.cai.grinding_action == "exit":
        raise InputError("cache 'elastic' with cai.grinding_action='exit' is not meaningful: the exit commits "
                         "the whole block at once, but an elastic step predicts only its window")


def _greedy_needs_an_order(config: "DecodeConfig") -> None:
    if config.cache == "dkv-greedy" and config.policy != "random":
        raise InputError(f"cache 'dkv-greedy' with policy {config.policy!r} is not meaningful: it computes only the "
                         "positions a step will decode, known in advance only from policy 'random' (its random "
                         "order), as in the official dKV-Cache-Greedy")
    if config.cache == "dkv-greedy" and config.dkv_window > config.block_length:
        raise InputError(f"dkv_window ({config.dkv_window}) is longer than the block ({config.block_length})")


def _wino_without_cache(config: "DecodeConfig") -> None:
    if config.policy == "wino" and config.cache != "none":
        raise InputError(f"policy 'wino' with cache={config.cache!r} is not meaningful: WINO's verify forward reads "
                         "the whole canvas with a shadow block each step (use cache='none')")


def _sub_blocks_divide_the_block(config: "DecodeConfig") -> None:
    if config.policy == "subblock" and config.block_length % config.sub_block:
        raise InputError(f"sub_block ({config.sub_block}) must divide block_length ({config.block_length}): "
                         "Fast-dLLM v2 decodes a block in whole sub-blocks")
    if config.cache == "subblock" and config.policy != "subblock":
        raise InputError(f"cache 'subblock' with policy {config.policy!r} is not meaningful: Fast-dLLM v2's "
                         "within-block cache follows its sub-blocks (use policy 'subblock', or cache 'block')")


def _positive_int(v) -> bool:
    return is_int(v) and v >= 1


def _unit_interval(v) -> bool:
    return is_number(v) and 0 < v <= 1


def _non_negative(v) -> bool:
    return is_number(v) and v >= 0


UNIT_INTERVAL = "in (0, 1]"
CAI_UNIT_FIELDS = ("theta_start", "theta_end", "block_end_floor", "fallback_threshold", "clip_low", "clip_high",
                   "easy_confidence", "hard_confidence")

# DecodeConfig.validate: every rule in this order; the first that fails names the problem.
VALIDATION: list[Callable[["DecodeConfig"], None]] = [
    FieldRule("gen_length", "a positive integer", _positive_int),
    FieldRule("elastic_scope", f"one of {', '.join(ELASTIC_SCOPES)}", lambda v: v in ELASTIC_SCOPES),
    _elastic_one_block,
    FieldRule("block_length", "a positive integer", _positive_int),
    _whole_blocks,
    FieldRule("steps", "a positive integer or None", lambda v: v is None or _positive_int(v)),
    FieldRule("minimal_topk", "an integer >= 1", _positive_int),
    _steps_per_block,
    _choice("policy", "policy", POLICIES),
    _choice("cache", "cache mode", CACHE_MODES),
    FieldRule("threshold", UNIT_INTERVAL, _unit_interval),
    # Block diffusion (LLaDA2.1 token editing; decode/block_diffusion.py).
    FieldRule("editing_threshold", "in [0, 1] (or None: no editing)",
              lambda v: v is None or (is_number(v) and 0 <= v <= 1)),
    FieldRule("max_post_steps", "an integer >= 0", lambda v: is_int(v) and v >= 0),
    FieldRule("num_to_transfer", "an integer >= 1 (or None: the schedule)", lambda v: v is None or _positive_int(v)),
    FieldRule("sub_block", "a positive integer", _positive_int),
    _sub_blocks_divide_the_block,
    FieldRule("factor", "a positive number", lambda v: v is None or (is_number(v) and v > 0)),
    FieldRule("refresh_every", "an integer >= 0 (0 = block starts only)", lambda v: v is None or (is_int(v) and v >= 0)),
    FieldRule("es_schedule", normalise=check_schedule),
    FieldRule("es_alpha", normalise=check_alpha),
    FieldRule("temperature", "a finite number >= 0", _non_negative),
    FieldRule("seed", "an integer or None", lambda v: v is None or is_int(v)),
    FieldRule("early_stop", "True or False", lambda v: isinstance(v, bool)),
    *(FieldRule(f"cai.{name}", UNIT_INTERVAL, _unit_interval) for name in CAI_UNIT_FIELDS),
    FieldRule("cai.warmup", "in [0, 1)", lambda v: is_number(v) and 0 <= v < 1),
    FieldRule("cai.block_end_decay", "a number >= 0", _non_negative),
    FieldRule("cai.grinding_yield", "a number >= 0", _non_negative),
    _clips_ordered,
    FieldRule("cai.grinding_patience", "an integer >= 1", _positive_int),
    FieldRule("cai.factors", "four positive numbers", lambda v: are_numbers(v, 4) and all(f > 0 for f in v)),
    FieldRule("cai.budget_fractions", "three numbers in (0, 1]",
              lambda v: are_numbers(v, 3) and all(0 < f <= 1 for f in v)),
    *(FieldRule(f"cai.{name}", "True or False", lambda v: isinstance(v, bool))
      for name in ("adaptive", "block_schedule", "position_factors")),
    FieldRule("cai.grinding_action", f"one of {', '.join(GRINDING_ACTIONS)}", lambda v: v in GRINDING_ACTIONS),
    FieldRule("cai.gating", "True, False or None (model default)", lambda v: v is None or isinstance(v, bool)),
    # The post-2025 decoders' settings (checked whatever the policy: a preset may be overridden field by field).
    FieldRule("eb_gamma", "a number >= 0 (0: one position per step)", _non_negative),
    FieldRule("eb_proxy", f"one of {', '.join(EB_PROXIES)}", lambda v: v in EB_PROXIES),
    FieldRule("sf_explore_steps", "a positive integer", _positive_int),
    FieldRule("sf_window", "a positive integer", _positive_int),
    _window_fits_the_block,
    FieldRule("sf_std", "a positive number", lambda v: is_number(v) and v > 0),
    FieldRule("sf_shortened", "True or False", lambda v: isinstance(v, bool)),
    *(FieldRule(name, UNIT_INTERVAL, _unit_interval)
      for name in ("sf_cycle_threshold", "sf_high", "wino_draft", "wino_verify")),
    _wino_thresholds_ordered,
    FieldRule("wino_max_steps", "a positive integer", _positive_int),
    _wino_without_cache,
    FieldRule("elastic_gamma", UNIT_INTERVAL, _unit_interval),
    FieldRule("elastic_window", "a positive integer or None", lambda v: v is None or _positive_int(v)),
    _elastic_window_fits,
    FieldRule("elastic_layer", "an integer >= 0", lambda v: is_int(v) and v >= 0),
    FieldRule("elastic_track", "a positive integer", _positive_int),
    _elastic_refreshes_adaptively,
    FieldRule("dkv_window", "an integer >= 0", lambda v: is_int(v) and v >= 0),
    _greedy_needs_an_order,
]


DECODE_FIELDS = {f.name for f in fields(DecodeConfig)} - {"cai", "method", "given"}
CAI_FIELDS = {f.name for f in fields(CAISettings)}
