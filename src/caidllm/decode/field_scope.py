"""Which decoders read which settings: a setting the caller gives that the request's decoder does not
read is refused, naming it and the methods that do read it, never silently ignored (`wino_draft`
with method cai, `eb_gamma` with fastdllm, a CAI constant with vanilla).

A setting is read by its policy (the commit rule) or by its cache mode (the forward between
refreshes). The model-level rules (a block-diffusion setting on a full-sequence model) are
decode/block_diffusion.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from caidllm.decode.config import CAI_FIELDS, DecodeConfig
from caidllm.decode.policies import policy_spec
from caidllm.errors import InputError


@dataclass(frozen=True)
class Scope:
    """The settings `fields` are read only under one of `policies` (or, for a cache's settings, `caches`)."""

    fields: tuple[str, ...]
    policies: tuple[str, ...] = ()
    caches: tuple[str, ...] = ()

    def reads(self, policy: str, cache: str) -> bool:
        return policy in self.policies or cache in self.caches

    def readers(self) -> str:
        return " or ".join([*(f"policy {p!r}" for p in self.policies), *(f"cache {c!r}" for c in self.caches)])


SCOPES = (
    Scope(("threshold",), policies=("threshold", "dynamic", "subblock", "cai")),  # cai: only with adaptive off (below)
    Scope(("factor",), policies=("threshold",)),
    Scope(("eb_gamma", "eb_proxy"), policies=("eb",)),
    Scope(("sf_explore_steps", "sf_cycle_threshold", "sf_window", "sf_std", "sf_high"), policies=("slowfast",)),
    Scope(("wino_draft", "wino_verify", "wino_max_steps"), policies=("wino",)),
    Scope(("num_to_transfer",), policies=("dynamic",)),
    Scope(("sub_block",), policies=("subblock",)),
    Scope(("minimal_topk",), policies=("dynamic", "static")),
    Scope(("cai", *sorted(CAI_FIELDS)), policies=("cai",)),
    Scope(("refresh_every",), caches=("prefix", "dual", "es", "dkv", "dkv-greedy", "elastic")),
    Scope(("es_schedule", "es_alpha"), caches=("es",)),
    Scope(("elastic_gamma", "elastic_window", "elastic_layer"), caches=("elastic",)),
    Scope(("dkv_window",), caches=("dkv-greedy",)),
)
SCOPE_OF = {name: scope for scope in SCOPES for name in scope.fields}


@dataclass(frozen=True)
class Unread:
    """`field` is not read, although its policy reads it in another mode, when `when(config)`."""

    field: str
    when: Callable[[DecodeConfig], bool]
    why: str  # what the decoder reads instead, and what to give


UNREAD = (
    Unread("threshold", lambda c: c.policy == "cai" and c.cai.adaptive,
           "with CAI's adaptive schedule on, its thresholds follow the schedule; give adaptive=false with it (the "
           "CLI: in a --settings file's cai) for a fixed threshold, or use method 'fastdllm'"),
    Unread("steps", lambda c: policy_spec(c.policy).revises,
           "a decoder that re-masks takes up to wino_max_steps steps a block, not steps; give wino_max_steps"),
)


def check_given_apply(config: DecodeConfig, presets: dict[str, dict]) -> None:
    """InputError naming the first setting in `config.given` that its policy and cache do not read
    (or that its policy does not read in the mode it runs in: UNREAD)."""
    for unread in UNREAD:
        if unread.field in config.given and unread.when(config):
            raise InputError(f"{unread.field} does not apply to method {config.method!r}: {unread.why}")
    for name in config.given:
        scope = SCOPE_OF.get(name)
        if scope is None or scope.reads(config.policy, config.cache):
            continue
        methods = [m for m, p in presets.items() if scope.reads(p.get("policy"), p.get("cache"))]
        raise InputError(f"{name} does not apply to method {config.method!r} (policy {config.policy!r}, cache "
                         f"{config.cache!r}): it is read only by {scope.readers()} (methods: {', '.join(methods)})")
