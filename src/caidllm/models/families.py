"""The registry of model families: which config.json each one reads and which
module it builds. A family is one entry (config.Family, defined beside its
module); adding one is adding it to FAMILIES, nothing else branches on names.
A config.json is recognised by its architectures first, then by the remote-code classes its auto_map names,
then by its model_type (the first family, in this order, that lists it)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ModelLoadError
from .config import ConfigFields, Family, ModelConfig, block_diffusion_fields, check_heads
from .diffusion_gemma import DIFFUSION_GEMMA
from .dream import DREAM
from .fastdllm_v2 import FASTDLLM_V2
from .llada import LLADA
from .llada2 import LLADA2
from .llada_moe import LLADA_MOE
from .nemotron import NEMOTRON_LABS_DIFFUSION
from .rnd1 import RND1
from .sdar import SDAR
from .stable_diffcoder import STABLE_DIFFCODER

FAMILIES: dict[str, Family] = {
    family.name: family for family in (LLADA, DREAM, LLADA_MOE, LLADA2, SDAR, FASTDLLM_V2, DIFFUSION_GEMMA)
}

# the 2026 derivatives (issue 46)
FAMILIES.update({family.name: family for family in (STABLE_DIFFCODER, RND1, NEMOTRON_LABS_DIFFUSION)})


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise ModelLoadError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of(raw: dict, source: str = "config.json") -> Family:
    """The family whose architectures (first) or model_type name this config.json."""
    model_type = str(raw.get("model_type", "")).lower()
    by_type = next((f for f in FAMILIES.values() if model_type in f.model_types), None)
    for arch in raw.get("architectures") or []:
        for family in FAMILIES.values():
            if arch in family.architectures:
                if by_type is not None and model_type not in family.model_types:
                    raise ModelLoadError(
                        f"{source}: architectures {raw.get('architectures')!r} name the {family.name} "
                        "family but "
                        f"model_type {raw.get('model_type')!r} names {by_type.name}; the fields contradict "
                        "each "
                        "other (fix one of them)"
                    )
                return family
    # A remote-code class named only in auto_map: Stable-DiffCoder's first revisions say "LlamaForCausalLM" in
    # architectures, their own class (SeedDiffcoderForCausalLM, a LlamaForCausalLM) in auto_map.
    for target in _auto_map_classes(raw):
        family = next((f for f in FAMILIES.values() if target in f.architectures), None)
        if family is not None:
            return family
    if by_type is not None:
        return by_type
    known = "; ".join(
        f"{f.name} (architectures {', '.join(f.architectures)}; model_type {', '.join(f.model_types)})"
        for f in FAMILIES.values()
    )
    raise ModelLoadError(
        f"{source}: unknown model architecture (architectures={raw.get('architectures')!r}, "
        f"model_type={raw.get('model_type')!r}); supported families: {known}"
    )


def _auto_map_classes(raw: dict) -> list[str]:
    """The class names config.json's auto_map points at ("module.Class", or a list of them per auto class)."""
    auto_map = raw.get("auto_map")
    targets = auto_map.values() if isinstance(auto_map, dict) else []
    flat = [t for v in targets for t in (v if isinstance(v, list) else [v])]
    return [t.rsplit(".", 1)[-1] for t in flat if isinstance(t, str)]


def load_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"missing config file {path}")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path} as JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return parse_config(raw, source=str(path))


def parse_config(raw: dict, source: str = "config.json") -> ModelConfig:
    """A ModelConfig from a config.json dict: the family's own fields by its entry's
    reader, then what every family shares (head checks, token ids, caidllm_* fields)."""
    family = family_of(raw, source)
    get = ConfigFields(raw, source)
    fields = family.read_fields(raw, get, source)
    d, h, kv = fields["hidden_size"], fields["n_heads"], fields["n_kv_heads"]
    head_dim = fields.pop("head_dim", None)
    if head_dim is None:  # heads split the hidden size (a family whose reader gives head_dim checks its own)
        head_dim = get.int("head_dim", None) or (d // h if h else 0)
        if h <= 0 or d % h or head_dim * h != d:
            raise ModelLoadError(f"{source}: hidden size {d} is not divisible into {h} heads")
    check_heads(h, kv, head_dim, source)

    fields["max_length"] = get.int("caidllm_max_length", fields["max_length"])
    if fields["max_length"] < 1:
        raise ModelLoadError(
            f"{source}: the model's context length must be positive, got {fields['max_length']}"
        )
    eos_id = fields.pop("eos_id", None)  # a family may know its official end id when config.json has none
    if eos_id is None:
        eos_id = get.int("eos_token_id")
    fields.setdefault("mask_id", get.int("mask_token_id", None))  # else the tokenizer's mask token
    if "block_causal" not in fields:  # a block-diffusion family's reader sets its own
        fields.update(block_diffusion_fields(raw, source))
    return ModelConfig(
        family=family.name,
        head_dim=head_dim,
        eos_id=eos_id,
        eos_ids=(eos_id,),  # widened with end-of-turn ids once the tokenizer is known
        pad_id=get.int("pad_token_id", eos_id),
        bos_id=get.int("bos_token_id", None),
        confidence_gating=get.bool("caidllm_confidence_gating", family.confidence_gating),
        cache_refresh_every=get.int("caidllm_cache_refresh_every", family.cache_refresh_every),
        torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        raw=raw,
        **fields,
    )
