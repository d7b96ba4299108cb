"""DiffusionLM: the one interface the decoders use, whatever the family.

Its forward runs one forward-mode object (models/modes/: each mode checks its inputs, selects
rows and positions, and computes) and returns float32 logits aligned to positions (Dream's
shift is undone in dream.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from .cache import KVCache
from .config import ModelConfig
from .layers import Context
from .modes import FORWARD_MODES, ForwardMode, Full
from .skip import check_schedule, hidden_levels


class DiffusionLM:
    """A loaded model (LLaDA, Dream, ...) with its config and tokenizer, behind the one interface the
    decoders use: `forward` in each forward mode (models/modes/) with float32 logits
    aligned to positions, `new_cache`, chat encoding and decoding; `generate` is the decoders'
    (registered by caidllm.decode)."""

    def __init__(
        self,
        model,
        config: ModelConfig,
        tokenizer,
        device: torch.device,
        dtype: torch.dtype,
        path=None,
        quantization: str | None = None,
        quantized_head: bool = False,
    ):
        self.model = model
        self.config = config
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.path = Path(path) if path is not None else None
        self.random_weights = False  # built by random_init.py: speed and memory only, the text means nothing
        self.compiled = False  # set by compiled.enable_compile
        # torchao quantized linear layers (models/quantize.py): "int8", "int8-dynamic", "int4", "fp8" or None;
        # self.dtype stays the activations' (and embeddings', norms', cache's) dtype
        self.quantization = quantization
        self.quantized_head = quantized_head
        # what it was loaded by (folder, hub id, random:...)
        self.name = str(path) if path is not None else None
        self.checkpoint = None  # the known public checkpoint it is (models/checkpoints.py), if any

    @property
    def chat_default(self) -> bool:
        """Whether prompts go through the chat template unless told: a known checkpoint's
        instruct flag (base models decode raw text), else whether the tokenizer has a template."""
        if self.checkpoint is not None:
            return self.checkpoint.instruct
        return bool(self.tokenizer.chat_template)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"DiffusionLM({c.family}, layers={c.n_layers}, d={c.hidden_size}, vocab={c.vocab_size}, "
            f"device={self.device}, dtype={self.dtype}, quantization={self.quantization}, path={self.path})"
        )

    # ---- forward passes -------------------------------------------------

    def logits(self, input_ids, attention_mask=None) -> torch.Tensor:
        """Float32 logits [B, L, V] of the whole canvas; index i predicts token i."""
        return self.forward(input_ids, attention_mask)

    @torch.no_grad()
    def forward(
        self, input_ids, attention_mask=None, cache: KVCache | None = None, mode: ForwardMode | None = None
    ) -> torch.Tensor:
        """Float32 logits [R, end - start, V] of the mode's block for its selected rows (all by
        default). input_ids / attention_mask: the full [B, L] canvas (mask: 1 = real token, left
        padding); cache: a KVCache from new_cache (a full forward fills it, the other modes read it);
        mode: one forward-mode object (models/modes/: Full, the default, Prefix, Dual, EarlySkipping,
        Block, DKV, Elastic, SubBlock, Verify), which carries that mode's inputs and computes it."""
        mode = Full() if mode is None else mode
        if not isinstance(mode, ForwardMode):
            known = ", ".join(f"{cls.__name__} ({name!r})" for name, cls in FORWARD_MODES.items())
            raise InputError(
                f"mode must be a forward-mode object from caidllm.models.modes ({known}); got {mode!r}"
            )
        return mode.run(self, mode.resolve(self, input_ids, attention_mask, cache))

    @torch.no_grad()
    def forward_with_attention(
        self, ids: torch.Tensor, positions: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Float32 logits [R, k, V] at columns ``targets`` [R, k] of a canvas ``ids`` [R, n] whose
        RoPE ``positions`` [R, n] and query-by-key ``attention`` [R, 1, n, n] (bool, True = attends)
        the caller gives: no padding, no cache. For decoders whose forward is not a plain canvas
        (WINO's shadow block, models/shadow.py); the logits are position-aligned only for
        families without a shift (Dream predicts i from i - 1: the caller must not use it there)."""
        c = self.config
        ctx = Context.build(torch.ones_like(ids, dtype=torch.bool), positions, c.rotary_dim, c.rope_theta)
        ctx.key_mask, ctx.targets = attention, targets
        return self.model(ids, ctx)

    def new_cache(
        self, batch_size: int, length: int, *, skip_schedule=None, every_layer: bool = False
    ) -> KVCache:
        """An empty cache for a [batch_size, length] canvas; fill it with a Full forward.
        With an early-skip schedule it also keeps the hidden states EarlySkipping reads; with
        every_layer, those of every layer's input and its queries (Elastic)."""
        c = self.config
        levels = tuple(range(c.n_layers)) if every_layer else ()
        if skip_schedule is not None:
            levels = hidden_levels(check_schedule(skip_schedule, "skip_schedule"), c.n_layers)
        for name, value in (("batch_size", batch_size), ("length", length)):
            if not isinstance(value, int) or value <= 0:
                raise InputError(f"new_cache: {name} must be a positive int, got {value!r}")
        if length > c.max_length:
            raise InputError(f"new_cache: length {length} exceeds the model's max_length {c.max_length}")
        return KVCache.allocate(
            c.n_layers,
            batch_size,
            c.n_kv_heads,
            length,
            c.head_dim,
            self.device,
            self.dtype,
            hidden_levels=levels,
            hidden_size=c.hidden_size,
            n_heads=c.n_heads if every_layer else None,
        )

    # ---- decoding -------------------------------------------------------

    # The decoders live a layer above the model: caidllm.decode registers its generate() here when
    # it is imported (importing caidllm does), so this module never imports them.
    _generate_function = None

    @classmethod
    def register_generate(cls, function) -> None:
        cls._generate_function = staticmethod(function)

    def generate(self, prompts, method: str | None = None, **options):
        """Decode `prompts` with a method preset; see caidllm.decode.generate (the same function)."""
        return self._generate_function(self, prompts, method=method, **options)

    # ---- text -----------------------------------------------------------

    def encode_chat(self, prompt: str) -> list[int]:
        """Token ids of `prompt` as one user message, with the chat template and
        the assistant generation prompt applied (the template adds BOS itself)."""
        if not isinstance(prompt, str):
            raise InputError(f"encode_chat expects a str prompt, got {type(prompt).__name__}")
        return self.encode_messages([{"role": "user", "content": prompt}])

    def encode_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a conversation ([{"role", "content"}, ...]) through the chat
        template, ending with the assistant generation prompt (tools: the template's, when it has them)."""
        if not self.tokenizer.chat_template:
            raise InputError(
                f"{self.name or self.path} has no chat template (its tokenizer_config.json has no "
                "chat_template: a base model?); decode the prompt as raw text with chat=False "
                "(--no-chat on the command line)"
            )
        extra = {"tools": tools} if tools else {}
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **extra
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        """Text of `ids`, special tokens (mask, eos, end of turn) left out."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        n = len(self.tokenizer)
        # Padding rows of the embedding (ids past the tokenizer) have no text.
        return self.tokenizer.decode([i for i in ids if 0 <= i < n], skip_special_tokens=True)
