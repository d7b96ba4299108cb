"""ModelConfig: one description of a model, whatever its family; Family: what
the registry (models/families.py) knows of one family: how to recognise its
config.json, read it into a ModelConfig, and build its module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ModelLoadError
from .moe import MoEConfig


@dataclass(frozen=True)
class ModelConfig:
    family: str  # a name of the registry (models/families.py): "llada", "dream", ...
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
    mask_id: int | None  # None until the tokenizer names it (config.json may not)
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
    # Newer layouts (LLaDA2, SDAR): RoPE on the first rope_dim dimensions of each head only
    # (0: all of them), an RMSNorm over each head's query and key, and a mixture-of-experts
    # feed-forward in every layer from dense_layers on (moe: None = dense everywhere).
    rope_dim: int = 0
    qk_norm: bool = False
    moe: MoEConfig | None = None
    dense_layers: int = 0
    # LLaDA2.2's edit tokens (config.json delete_token_id, split_token_id), which its InDel decoder writes;
    # None: the model has none (no InDel decoding).
    edit_tokens: tuple[int, int] | None = None

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that RoPE rotates."""
        return self.rope_dim or self.head_dim


def block_diffusion_fields(raw: dict, source: str) -> dict:
    """block_causal / block_lengths of a config that marks a LLaDA-layout model block-causal
    ("caidllm_block_causal": true, "caidllm_block_lengths": [8, 32], as tiny-bd's does)."""
    block_causal = ConfigFields(raw, source).bool("caidllm_block_causal", False)
    lengths = raw.get("caidllm_block_lengths")
    if lengths is None:
        return dict(block_causal=block_causal, block_lengths=())
    if not block_causal:
        raise ModelLoadError(f"{source}: caidllm_block_lengths is set but caidllm_block_causal is not true")
    if not (
        isinstance(lengths, list)
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths)
    ):
        raise ModelLoadError(
            f"{source}: field 'caidllm_block_lengths' = {lengths!r} must be a list of positive integers"
        )
    return dict(block_causal=True, block_lengths=tuple(lengths))


def check_heads(n_heads: int, n_kv_heads: int, head_dim: int, source: str) -> None:
    """Grouped-query heads and an even head_dim (RoPE rotates pairs)."""
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ModelLoadError(
            f"{source}: {n_heads} attention heads cannot be grouped over {n_kv_heads} key/value heads"
        )
    if head_dim <= 0 or head_dim % 2:
        raise ModelLoadError(f"{source}: head_dim {head_dim} must be even for rotary embeddings")


class ConfigFields:
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
            raise ModelLoadError(
                f"{self.source}: field {key!r} = {value!r} is not a valid {cast.__name__}"
            ) from None

    def bool(self, key, default=_MISSING):
        """A JSON true/false only: a string such as "false" would otherwise read as True."""
        value = self.raw.get(key)
        if value is None:
            return self._get(key, default, bool)
        if not isinstance(value, bool):
            raise ModelLoadError(
                f"{self.source}: field {key!r} = {value!r} must be true or false (a JSON boolean)"
            )
        return value

    def int(self, key, default=_MISSING):
        return self._get(key, default, int)

    def float(self, key, default=_MISSING):
        return self._get(key, default, float)


@dataclass(frozen=True)
class Family:
    """One model family of the registry (models/families.py).

    architectures / model_types: the config.json values that name it (model_type compared
    lower-cased). read_fields(raw, fields, source): the family's own config.json fields as
    ModelConfig fields (at least the sizes: vocab_size, hidden_size, n_layers, n_heads,
    n_kv_heads, intermediate_size, rope_theta, rms_norm_eps, max_length, qkv_bias,
    tie_embeddings; block-diffusion families also block_causal / block_lengths); token ids,
    head_dim and caidllm's own fields are read the same way for every family.
    model_class(config): the torch module whose state dict matches the checkpoint's names.
    confidence_gating / cache_refresh_every: the decoder defaults for the family (DESIGN.md),
    which config.json may override with caidllm_confidence_gating / caidllm_cache_refresh_every.
    block_causal: every model of the family has block-causal attention (a block-diffusion family);
    `caidllm models` reads the decoders and cache modes that apply from the decode registries.
    """

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    read_fields: Callable[[dict, ConfigFields, str], dict]
    model_class: type
    confidence_gating: bool
    cache_refresh_every: int
    description: str = ""
    block_causal: bool = False
    # uniform-state diffusion (DiffusionGemma): no mask token, its own decoders (the mask-based ones refuse
    # it)
    uniform: bool = False
    # one checkpoint trained both causal and bidirectional (Nemotron-Labs-Diffusion): its own decoders (ar,
    # block diffusion with causal context, linear-spec) run over a causal KV cache (decode/nemotron.py); the
    # mask engine's decoders refuse it
    sequential: bool = False
    # config.json's mask_token_id is taken whatever the token's text (Nemotron's 100 is a reserved slot of
    # its Tekken vocabulary, whose spelling the stored copies do not give)
    mask_from_config: bool = False
    # checkpoint tensors the module does not hold and the loader skips (a vision tower, tied copies)
    ignores_weight: Callable[[str], bool] | None = None
    # (what, size) pairs --tp must divide besides the heads, widths and experts plan.py checks for every
    # family (DiffusionGemma: its full layers' key/value heads, its dense MLP beside the experts)
    tp_sizes: Callable[[object], list[tuple[str, int]]] | None = None
