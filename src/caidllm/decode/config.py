"""Plain dataclasses holding every knob of the decoder.

`DecodeConfig` is what the engine reads; `CAISettings` groups the CAI-dLLM
controller's constants (paper Boxes 3-7 and DESIGN.md's readings of them).
Presets (presets.py) are just named sets of overrides of these fields.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field, fields

from caidllm.decode import forward_modes, policies
from caidllm.errors import InputError
from caidllm.models.skip import DEFAULT_ALPHA, DEFAULT_SCHEDULE, check_alpha, check_schedule

# The valid values, read from their registries: cache modes (decode/forward_modes.py; "es" is the dual
# cache with ES-dLLM early skipping, models/skip.py) and commit policies (decode/policies/).
CACHE_MODES = tuple(forward_modes.CACHE_MODES)
POLICIES = tuple(policies.POLICIES)
# What the CAI controller does after K low-yield steps (Box 7): "continue" commits the masked tokens above the
# fallback threshold and goes on; "exit" ends the block, committing every still-masked position with its
# current prediction in that same step (Algorithm 1's `break`, without leaving a mask behind).
GRINDING_ACTIONS = ("continue", "exit")


@dataclass
class CAISettings:
    """CAI-dLLM controller constants. Each switch turns one component on or off
    (the paper's ablation: fixed threshold vs APD, +block schedule, +position
    factors, +budgets/grinding)."""

    adaptive: bool = True  # cosine schedule (APD); False = fixed `DecodeConfig.threshold`
    block_schedule: bool = True  # end threshold decreases with the block index (Box 4)
    position_factors: bool = True  # per-quarter factors on the threshold (Box 6)
    gating: bool | None = None  # budgets + grinding fallback (Boxes 5, 7); None = model default
    theta_start: float = 0.90
    theta_end: float = 0.70  # end threshold of block 1 (and of every block without the block schedule)
    warmup: float = 0.15  # fraction w of the block's steps held at theta_start
    block_end_decay: float = 0.10  # theta_e(b) = max(theta_end - decay * (b - 1), floor)
    block_end_floor: float = 0.40
    factors: tuple[float, float, float, float] = (0.80, 0.90, 1.05, 1.10)  # by quarter of the block
    clip_low: float = 0.20
    clip_high: float = 0.98
    easy_confidence: float = 0.50  # s_i above this (and in the first half) -> short budget
    hard_confidence: float = 0.25  # s_i below this (or in the last quarter) -> full budget
    budget_fractions: tuple[float, float, float] = (1 / 8, 1 / 2, 1.0)  # of T: easy / normal / hard (8/32/64 at T=64)
    grinding_yield: float = 1.5  # a step committing fewer tokens than this is low-yield
    grinding_patience: int = 4  # K low-yield steps in a row trigger the fallback
    fallback_threshold: float = 0.40  # on grinding, commit masked tokens with c > this ("continue")
    grinding_action: str = "continue"  # GRINDING_ACTIONS: go on after the fallback, or end the block there


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
    factor: float | None = None  # Fast-dLLM factor rule instead of the threshold rule
    temperature: float = 0.0
    seed: int | None = None
    early_stop: bool = True
    cai: CAISettings = field(default_factory=CAISettings)
    # The fields the caller set (build_config fills it): on a model family a setting does not apply to,
    # a given one is refused, a preset's default is replaced by the family's (decode/block_diffusion.py).
    given: tuple[str, ...] = ()

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
        """Raise InputError naming the first invalid value."""
        for name in ("gen_length", "block_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        if self.gen_length % self.block_length:
            raise InputError(
                f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})"
            )
        if self.steps is not None:
            if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
                raise InputError(f"steps must be a positive integer or None, got {self.steps!r}")
            if self.steps % self.num_blocks:
                raise InputError(
                    f"steps ({self.steps}) must be a multiple of the number of blocks "
                    f"({self.num_blocks} = gen_length {self.gen_length} / block_length {self.block_length})"
                )
        if self.editing_threshold is not None and not (_is_number(self.editing_threshold)
                                                       and 0 <= self.editing_threshold <= 1):
            raise InputError(f"editing_threshold must be in [0, 1] (or None: no editing), got {self.editing_threshold!r}")
        if not (_is_int(self.max_post_steps) and self.max_post_steps >= 0):
            raise InputError(f"max_post_steps must be an integer >= 0, got {self.max_post_steps!r}")
        if self.num_to_transfer is not None and not (_is_int(self.num_to_transfer) and self.num_to_transfer >= 1):
            raise InputError(f"num_to_transfer must be an integer >= 1 (or None: the schedule), "
                             f"got {self.num_to_transfer!r}")
        if not (_is_int(self.minimal_topk) and self.minimal_topk >= 1):
            raise InputError(f"minimal_topk must be an integer >= 1, got {self.minimal_topk!r}")
        if self.steps_per_block < 1:
            raise InputError(f"steps per block must be at least 1, got {self.steps_per_block}")
        if self.policy not in POLICIES:
            raise InputError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.cache not in CACHE_MODES:
            raise InputError(f"unknown cache mode {self.cache!r}; choose one of {', '.join(CACHE_MODES)}")
        _check_unit_interval("threshold", self.threshold)
        if self.factor is not None and not (_is_number(self.factor) and self.factor > 0):
            raise InputError(f"factor must be a positive number, got {self.factor!r}")
        if self.refresh_every is not None and not (_is_int(self.refresh_every) and self.refresh_every >= 0):
            raise InputError(f"refresh_every must be an integer >= 0 (0 = block starts only), got {self.refresh_every!r}")
        self.es_schedule = check_schedule(self.es_schedule, "es_schedule")
        self.es_alpha = check_alpha(self.es_alpha, "es_alpha")
        if not (_is_number(self.temperature) and self.temperature >= 0):
            raise InputError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise InputError(f"seed must be an integer or None, got {self.seed!r}")
        c = self.cai
        for name in ("theta_start", "theta_end", "block_end_floor", "fallback_threshold", "clip_low", "clip_high",
                     "easy_confidence", "hard_confidence"):
            _check_unit_interval(f"cai.{name}", getattr(c, name))
        if not (_is_number(c.warmup) and 0 <= c.warmup < 1):
            raise InputError(f"cai.warmup must be in [0, 1), got {c.warmup!r}")
        if not (_is_number(c.block_end_decay) and c.block_end_decay >= 0):
            raise InputError(f"cai.block_end_decay must be a number >= 0, got {c.block_end_decay!r}")
        if not (_is_number(c.grinding_yield) and c.grinding_yield >= 0):
            raise InputError(f"cai.grinding_yield must be a number >= 0, got {c.grinding_yield!r}")
        if c.clip_low > c.clip_high:
            raise InputError(f"cai.clip_low ({c.clip_low}) must not exceed cai.clip_high ({c.clip_high})")
        if not (_is_int(c.grinding_patience) and c.grinding_patience >= 1):
            raise InputError(f"cai.grinding_patience must be an integer >= 1, got {c.grinding_patience!r}")
        if not (_numbers(c.factors, 4) and all(f > 0 for f in c.factors)):
            raise InputError(f"cai.factors must be four positive numbers, got {c.factors!r}")
        if not (_numbers(c.budget_fractions, 3) and all(0 < f <= 1 for f in c.budget_fractions)):
            raise InputError(f"cai.budget_fractions must be three numbers in (0, 1], got {c.budget_fractions!r}")
        for name in ("adaptive", "block_schedule", "position_factors"):
            if not isinstance(getattr(c, name), bool):
                raise InputError(f"cai.{name} must be True or False, got {getattr(c, name)!r}")
        if c.grinding_action not in GRINDING_ACTIONS:
            raise InputError(f"cai.grinding_action must be one of {', '.join(GRINDING_ACTIONS)}, "
                             f"got {c.grinding_action!r}")
        if c.gating is not None and not isinstance(c.gating, bool):
            raise InputError(f"cai.gating must be True, False or None (model default), got {c.gating!r}")
        return self


def _is_number(value) -> bool:
    """A finite int or float (bools are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers(values, count: int) -> bool:
    return isinstance(values, (tuple, list)) and len(values) == count and all(_is_number(v) for v in values)


def _check_unit_interval(name: str, value) -> None:
    if not (_is_number(value) and 0 < value <= 1):
        raise InputError(f"{name} must be in (0, 1], got {value!r}")


DECODE_FIELDS = {f.name for f in fields(DecodeConfig)} - {"cai", "method", "given"}
CAI_FIELDS = {f.name for f in fields(CAISettings)}
