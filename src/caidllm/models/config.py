"""ModelConfig: one description of a LLaDA or Dream model, parsed from the
official config.json of either family (their field names differ)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelLoadError

FAMILIES = ("llada", "dream")
ARCHITECTURES = {"LLaDAModelLM": "llada", "DreamModel": "dream"}

# Decoder defaults per family (DESIGN.md): confidence gating on for LLaDA,
# off for Dream; cache refresh every 16 steps (LLaDA) / 8 steps (Dream).
FAMILY_DEFAULTS = {
    "llada": {"confidence_gating": True, "cache_refresh_every": 16},
    "dream": {"confidence_gating": False, "cache_refresh_every": 8},
}
# Dream's config.json inherits max_position_embeddings = 131072 from Qwen2.5, but
# the model was trained on about 2048 tokens (REFERENCE.md): longer canvases are
# accepted only when config.json says so with "caidllm_max_length".
DREAM_USABLE_CONTEXT = 2048


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llada" | "dream"
    vocab_size: int  # rows of the embedding / LM head (may exceed the tokenizer)
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    max_length: int  # longest canvas the model accepts
    qkv_bias: bool
    tie_embeddings: bool  # LM head shares the input embedding matrix
    mask_id: int
    eos_id: int  # fills the canvas after an answer ends
    eos_ids: tuple[int, ...]  # every id that ends an answer (eos, end of turn)
    pad_id: int
    bos_id: int | None
    confidence_gating: bool
    cache_refresh_every: int
    torch_dtype: str  # the checkpoint's dtype name, e.g. "bfloat16"
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    # Block diffusion (LLaDA2.x, SDAR, tiny-bd): attention is block-causal (a position sees its own
    # block and every earlier one), so a finished block's keys and values are exact and final.
    # block_lengths: the block lengths the model decodes with (empty: any, for full-sequence models).
    block_causal: bool = False
    block_lengths: tuple[int, ...] = ()


def detect_family(raw: dict, source: str = "config.json") -> str:
    for arch in raw.get("architectures") or []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = str(raw.get("model_type", "")).lower()
    if model_type in FAMILIES:
        return model_type
    raise ModelLoadError(
        f"{source}: unknown model architecture (architectures="
        f"{raw.get('architectures')!r}, model_type={raw.get('model_type')!r}); "
        f"supported: architectures {sorted(ARCHITECTURES)} or model_type 'llada'/'dream'"
    )


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
    family = detect_family(raw, source)
    get = _Getter(raw, source)
    if family == "llada":
        _check_llada_flags(raw, source)
        d = get.int("d_model")
        n_heads = get.int("n_heads")
        sizes = dict(
            # The weights are sized by embedding_size when it is set (it pads vocab_size).
            vocab_size=get.int("embedding_size", None) or get.int("vocab_size"),
            hidden_size=d,
            n_layers=get.int("n_layers"),
            n_heads=n_heads,
            n_kv_heads=get.int("n_kv_heads", None) or n_heads,
            intermediate_size=get.int("mlp_hidden_size"),
            rope_theta=get.float("rope_theta", 10000.0),
            rms_norm_eps=get.float("rms_norm_eps", 1e-5),
            max_length=get.int("max_sequence_length"),
            qkv_bias=bool(raw.get("include_qkv_bias") or raw.get("include_bias")),
            tie_embeddings=bool(raw.get("weight_tying", False)),
        )
    else:
        if raw.get("rope_scaling"):
            raise ModelLoadError(f"{source}: rope_scaling={raw['rope_scaling']!r} is not supported (expected null)")
        if raw.get("use_sliding_window"):
            raise ModelLoadError(f"{source}: use_sliding_window=true is not supported (expected false)")
        n_heads = get.int("num_attention_heads")
        sizes = dict(
            vocab_size=get.int("vocab_size"),
            hidden_size=get.int("hidden_size"),
            n_layers=get.int("num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=get.int("num_key_value_heads", None) or n_heads,
            intermediate_size=get.int("intermediate_size"),
            rope_theta=get.float("rope_theta", 10000.0),
            rms_norm_eps=get.float("rms_norm_eps", 1e-6),
            max_length=min(get.int("max_position_embeddings"), DREAM_USABLE_CONTEXT),
            qkv_bias=True,  # Qwen2 layout: q/k/v always carry biases
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )
    d, h, kv = sizes["hidden_size"], sizes["n_heads"], sizes["n_kv_heads"]
    head_dim = get.int("head_dim", None) or (d // h if h else 0)
    if h <= 0 or d % h or head_dim * h != d:
        raise ModelLoadError(f"{source}: hidden size {d} is not divisible into {h} heads")
    if kv <= 0 or h % kv:
        raise ModelLoadError(f"{source}: {h} attention heads cannot be grouped over {kv} key/value heads")
    if head_dim % 2:
        raise ModelLoadError(f"{source}: head_dim {head_dim} must be even for rotary embeddings")

    sizes["max_length"] = get.int("caidllm_max_length", sizes["max_length"])
    if sizes["max_length"] < 1:
        raise ModelLoadError(f"{source}: the model's context length must be positive, got {sizes['max_length']}")
    eos_id = get.int("eos_token_id")
    defaults = FAMILY_DEFAULTS[family]
    return ModelConfig(
        family=family,
        head_dim=head_dim,
        mask_id=get.int("mask_token_id"),
        eos_id=eos_id,
        eos_ids=(eos_id,),  # widened with end-of-turn ids once the tokenizer is known
        pad_id=get.int("pad_token_id", eos_id),
        bos_id=get.int("bos_token_id", None),
        confidence_gating=get.bool("caidllm_confidence_gating", defaults["confidence_gating"]),
        cache_refresh_every=get.int("caidllm_cache_refresh_every", defaults["cache_refresh_every"]),
        torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        raw=raw,
        **block_diffusion_fields(raw, source),
        **sizes,
    )


def block_diffusion_fields(raw: dict, source: str) -> dict:
    """block_causal / block_lengths of a config that marks a LLaDA-layout model block-causal
    ("caidllm_block_causal": true, "caidllm_block_lengths": [8, 32], as tiny-bd's does)."""
    block_causal = _Getter(raw, source).bool("caidllm_block_causal", False)
    lengths = raw.get("caidllm_block_lengths")
    if lengths is None:
        return dict(block_causal=block_causal, block_lengths=())
    if not block_causal:
        raise ModelLoadError(f"{source}: caidllm_block_lengths is set but caidllm_block_causal is not true")
    if not (isinstance(lengths, list) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                              for n in lengths)):
        raise ModelLoadError(f"{source}: field 'caidllm_block_lengths' = {lengths!r} must be a list of "
                             "positive integers")
    return dict(block_causal=True, block_lengths=tuple(lengths))


def _check_llada_flags(raw: dict, source: str) -> None:
    # Settings of the LLaDA (OLMo-style) config that this implementation does
    # not model; reject them instead of computing something silently different.
    expected = {
        "block_type": ("llama", None),
        "activation_type": ("silu", "swiglu", None),
        "layer_norm_type": ("rms", None),
        "rope": (True, None),
        "alibi": (False, None),
        "attention_layer_norm": (False, None),
        "input_emb_norm": (False, None),
        "scale_logits": (False, None),
    }
    for key, allowed in expected.items():
        if raw.get(key) not in allowed:
            wanted = " or ".join(repr(a) for a in allowed if a is not None)
            raise ModelLoadError(f"{source}: unsupported LLaDA setting {key}={raw.get(key)!r} (expected {wanted})")


class _Getter:
    """Reads typed fields, naming the field and file when one is missing or wrong."""

    _MISSING = object()

    def __init__(self, raw: dict, source: str):
        self.raw, self.source = raw, source

    def _get(self, key, default, cast):
        value = self.raw.get(key)
        if value is None:
            if default is self._MISSING:
                raise ModelLoadError(f"{self.source}: missing required field {key!r}")
            return default
        if isinstance(value, list) and cast is int and value:
            value = value[0]  # eos_token_id may be a list; the first is the canonical one
        try:
            if isinstance(value, bool) or (cast is int and float(value) != int(value)):
                raise TypeError
            return cast(value)
        except (TypeError, ValueError):
            raise ModelLoadError(f"{self.source}: field {key!r} = {value!r} is not a valid {cast.__name__}") from None

    def bool(self, key, default=_MISSING):
        """A JSON true/false only: a string such as "false" would otherwise read as True."""
        value = self.raw.get(key)
        if value is None:
            return self._get(key, default, bool)
        if not isinstance(value, bool):
            raise ModelLoadError(f"{self.source}: field {key!r} = {value!r} must be true or false (a JSON boolean)")
        return value

    def int(self, key, default=_MISSING):
        return self._get(key, default, int)

    def float(self, key, default=_MISSING):
        return self._get(key, default, float)
