"""Block diffusion in the engine: which settings apply to which model, and a request's layout.

A block-causal model (LLaDA2.x, SDAR, tiny-bd) sees, from each position, its own block and every
earlier one. Its canvas is laid in blocks from position 0 (the first prompt token), as the
official generators lay it: the block holding the end of the prompt is part prompt, part masks,
and the last block may run past gen_length (those positions are decoded, never returned).
Its exact cache ("block"): the first forward of a request computes the whole canvas (prompt
blocks prefilled once); each later step forwards only the current block against the cache; a
completed block's final keys/values are written by the next block's first forward (``fold``).
Across requests, complete blocks' final keys/values are kept by the prefix store (prefix_store.py,
prefix_reuse.py): a request that finds its prompt's first blocks there skips their prefill.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from caidllm.decode.config import DecodeConfig
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.methods import PRESETS, block_diffusion_preset, preset_config, refuse_unread
from caidllm.decode.setting_names import rules_of
from caidllm.errors import InputError
from caidllm.models.transfer import to_device
from caidllm.setting_rules import BLOCK_CAUSAL, FULL_SEQUENCE

# The exact caches (the block cache, Fast-dLLM v2's within-block cache over it) or the whole window recomputed
# every step: read from the registry.
BLOCK_CACHES = tuple(name for name, mode in CACHE_MODES.items() if mode.exact or not mode.uses_cache)
# Caches that are their method (ES-dLLM, Elastic-Cache, dKV-Cache): on a block-causal model they are
# refused, never swapped for the block cache under the method's name; the advice is the same rule on it
# (the policy's block_causal_method).
METHOD_CACHES = {name: mode.method for name, mode in CACHE_MODES.items() if mode.method is not None}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a request's blocks lie in its generated region (positions after the prompt)."""

    lead: int  # prompt positions in the first decoded block (its block starts `lead` before the answer)
    span: int  # generated positions laid out: gen_length, up to the end of the last block
    num_blocks: int  # blocks decoded

    @classmethod
    def of(cls, prompt_length: int, config: DecodeConfig, block_causal: bool) -> Layout:
        bl, G = config.block_length, config.gen_length
        if not block_causal:
            return cls(0, G, config.num_blocks)
        lead = prompt_length % bl
        span = -(-(prompt_length + G) // bl) * bl - prompt_length
        return cls(lead, span, (lead + span) // bl)


def check_given_fit(given, model) -> None:
    """InputError naming the first setting in `given` (names as given: shared, flat or dotted) that the
    model's kind never reads, whatever the method (the field rules' `models`: an owner's rule says it).
    Checked before the method's own reading (methods.refuse_unread), whose advice (another method)
    would otherwise name one this model refuses in turn."""
    kind = BLOCK_CAUSAL if model.block_causal else FULL_SEQUENCE
    for name in given:
        rules = rules_of(name)
        if not rules or any(rule.models in (None, kind) for rule in rules):
            continue
        if kind == FULL_SEQUENCE:
            raise InputError(
                f"{name} ({rules[0].about}) does not apply to the {model.family} model: it is a "
                "block-diffusion decoder's setting, and this model is full-sequence",
                field=name,
            )
        raise InputError(f"{name} does not apply to a block-causal model: {rules[0].about}", field=name)


def fit_to_model(config: DecodeConfig, model, strict: bool = False) -> DecodeConfig:
    """`config` as it runs on the model (its ModelConfig): a setting the caller gave that does not
    apply to the family raises InputError naming it; a preset's default that does not apply is
    replaced by the family's (every preset runs on a block-causal model's exact block cache, unless
    the caller asks for cache="none", the whole window recomputed every step). strict: a setting the
    caller gave that the method does not read is refused too (after the model's own refusals, whose
    advice comes first). Fitted once: a config already fitted to these traits is returned as is."""
    traits = (model.family, model.block_causal, tuple(model.block_lengths or ()))
    if config.fitted_to == traits:
        return config
    check_given_fit([*config.given, *config.foreign], model)
    if strict:
        refuse_unread(config)
    fitted = _fit_family(config, model)
    fitted.fitted_to = traits
    return fitted


def _fit_family(config: DecodeConfig, model) -> DecodeConfig:
    given = set(config.given)
    if not model.block_causal:
        if block_diffusion_preset(config.method) or config.policy_spec.models == BLOCK_CAUSAL:
            raise InputError(
                f"method {config.method!r} (policy {config.policy!r}) is a block-diffusion decoder; "
                f"the {model.family} model is full-sequence (bidirectional attention)",
                field="policy" if "policy" in given else "method",
            )
        if config.editing_threshold is not None:  # a preset's (the caller's was refused above)
            check_given_fit(["editing_threshold"], model)
        if CACHE_MODES[config.cache].exact:
            raise InputError(
                f"cache={config.cache!r} (the exact block cache) does not apply to the {model.family} "
                f"model: its attention is bidirectional; use one that is not exact "
                f"({', '.join(m for m, mode in CACHE_MODES.items() if not mode.exact)})",
                field="cache" if "cache" in given else "method",
            )
        return config
    _check_edit_tokens(config, model, given)
    changes = {}
    if "cache" not in given and config.cache in METHOD_CACHES:
        raise InputError(
            f"method {config.method!r} does not apply to the block-causal {model.family} model: its "
            f"cache {config.cache!r} is {METHOD_CACHES[config.cache]}, which needs bidirectional "
            f"attention; use method {config.policy_spec.block_causal_method!r} (its rule "
            "on the exact block cache)",
            field="method",
        )
    own_forward = config.policy_spec.forward
    if own_forward is not None:  # refused here, with no advice about its cache that a second refusal undoes
        raise InputError(
            f"method {config.method!r} does not apply to the block-causal {model.family} model: its "
            f"policy {config.policy!r} runs the {own_forward} forward each step, which needs "
            "bidirectional attention; use method 'fastdllm' or a block-diffusion decoder "
            f"({', '.join(m for m in PRESETS if block_diffusion_preset(m))})",
            field="policy" if "policy" in given else "method",
        )
    if "cache" not in given and not CACHE_MODES[config.cache].exact:
        # The block cache is exact (the same tokens as no cache), so every preset runs on it, vanilla too
        # (Fast-dLLM v2's keeps its within-block cache over it).
        changes["cache"] = "block"
    elif config.cache not in BLOCK_CACHES:
        raise InputError(
            f"cache={config.cache!r} does not apply to the block-causal {model.family} model: its cache "
            f"is an exact one or 'none' (the whole window every step): {', '.join(BLOCK_CACHES)}",
            field="cache",
        )
    if model.block_lengths and config.block_length not in model.block_lengths and "block_length" not in given:
        changes["block_length"] = own_block_length(config.block_length, model)
    elif model.block_lengths and config.block_length not in model.block_lengths:
        raise InputError(
            f"block_length {config.block_length} is not one the {model.family} model decodes with "
            f"(allowed: {', '.join(map(str, model.block_lengths))})",
            field="block_length",
        )
    config.policy_settings.check_model(config, model)  # the method's own settings against the family
    if changes == {"cache": config.cache}:
        return config
    return dataclasses.replace(config, **changes).validate()


def _check_edit_tokens(config: DecodeConfig, model, given: set) -> None:
    """A policy writing edit tokens (LLaDA2.2's InDel), or its settings, need a model with them (ModelTraits:
    not known)."""
    if getattr(model, "edit_tokens", ()) is not None:
        return
    settings = [n for n in [*config.given, *config.foreign] if n.split(".")[0] == "indel"]
    if settings and not config.policy_spec.rewrites:
        raise InputError(
            f"{settings[0]} (LLaDA2.2's InDel editing) does not apply to the {model.family} model: it has no "
            "edit tokens (config.json delete_token_id / split_token_id)",
            field=settings[0],
        )
    if config.policy_spec.rewrites:
        raise InputError(
            f"method {config.method!r} (policy {config.policy!r}: InDel editing) needs a model with edit "
            f"tokens (config.json delete_token_id / split_token_id, LLaDA2.2's); the {model.family} model "
            "has none",
            field="policy" if "policy" in given else "method",
        )


def own_block_length(block_length: int, model) -> int:
    """A preset's block length where the model (its ModelConfig) decodes with it, else the model's own
    (its first): the block length a caller who gives none gets."""
    if model.block_lengths and block_length not in model.block_lengths:
        return model.block_lengths[0]
    return block_length


@dataclasses.dataclass(frozen=True)
class ModelTraits:
    """What fit_to_model reads of a model: its family, attention and block lengths."""

    family: str
    block_causal: bool
    block_lengths: tuple[int, ...] = ()


def applicable(model) -> tuple[list[str], list[str]]:
    """The method presets and cache modes that run on `model` (a ModelConfig or ModelTraits), read
    from the registries (PRESETS, CACHE_MODES) through fit_to_model: a list that cannot go stale. A
    uniform-state family (DiffusionGemma) runs its own decoders, with its per-request canvas cache; so does a
    sequential one (Nemotron-Labs-Diffusion), over its causal KV cache."""
    from caidllm.decode.diffusiongemma_settings import UNIFORM_METHODS
    from caidllm.models.families import FAMILIES

    if getattr(FAMILIES.get(model.family), "uniform", False):
        return list(UNIFORM_METHODS), ["canvas"]
    if getattr(FAMILIES.get(model.family), "sequential", False):  # decode/nemotron.py, over a causal KV cache
        from caidllm.decode.nemotron import SEQUENTIAL_METHODS

        return list(SEQUENTIAL_METHODS), ["kv"]
    methods = []
    for name in PRESETS:
        try:
            fit_to_model(preset_config(name), model)
        except InputError:
            continue
        methods.append(name)
    caches = [
        m for m, mode in CACHE_MODES.items() if (m in BLOCK_CACHES if model.block_causal else not mode.exact)
    ]
    return methods, caches


# ---- LLaDA2.1 token editing ------------------------------------------------------------------
# A committed, non-prompt position of the current block whose prediction differs from its token,
# with confidence above editing_threshold, is rewritten. Once the block has no mask left, up to
# max_post_steps more steps may edit it; the block ends at the first step that starts without a
# mask and edits nothing. Earlier blocks never change, so a block's text is final when it ends:
# only then is it streamed (the team's rule for decoders that revise tokens).


def edits(
    members,
    predicted: torch.Tensor,
    confidence: torch.Tensor,
    masked: torch.Tensor,
    block: torch.Tensor,
    columns: torch.Tensor,
    answer_starts: list[int],
) -> torch.Tensor | None:
    """[R, block] positions each editing request rewrites this step (None: no request edits)."""
    thresholds = [r.config.editing_threshold for r in members]
    if all(t is None for t in thresholds):
        return None
    device = masked.device
    limit = to_device([math.inf if t is None else t for t in thresholds], device, torch.float32)
    # the part-prompt block's prompt never changes
    answer = columns >= to_device(answer_starts, device)[:, None]
    return ~masked & answer & (predicted != block) & (confidence > limit[:, None])


def editing_block_done(r, started_masked: bool, edited: bool) -> bool:
    """Whether an editing request's block ends after this step (the official loop's rule)."""
    if not started_masked and not edited:
        return True
    block_start, block_end = r.block_bounds
    answer = range(max(block_start, 0), block_end)
    if any(r.generated[p] is None for p in answer):
        return False
    # Steps run since the one that committed the block's last mask (0 at that step): read from the trace.
    post_steps = r.step - max(r.commit_step_in_block[p] for p in answer)
    return post_steps + 1 > r.config.max_post_steps  # the next step would be one post-step too many
