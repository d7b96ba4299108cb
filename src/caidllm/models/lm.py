"""DiffusionLM: the one interface the decoders use, whatever the family.

It checks inputs, turns the attention mask into positions, selects rows and
positions for the cache modes, and returns float32 logits aligned to
positions (Dream's shift is undone in dream.py).
"""

from __future__ import annotations

import operator
from pathlib import Path

import torch

from ..errors import InputError
from .cache import KVCache
from .config import ModelConfig
from .forward_modes import MODES, ForwardMode
from .elastic import forward_elastic
from .layers import Context, default_attention_block, positions_from_mask
from .shadow import shadow_forward
from .sub_block import forward_sub_block
from .skip import EarlySkip, check_schedule, hidden_levels, keep_counts
from .transfer import to_device



class DiffusionLM:
    """A loaded model (LLaDA, Dream, ...) with its config and tokenizer, behind the one interface the
    decoders use: `forward` in each forward mode (models/forward_modes.py) with float32 logits
    aligned to positions, `new_cache`, chat encoding and decoding; `generate` is the decoders'
    (registered by caidllm.decode)."""

    def __init__(self, model, config: ModelConfig, tokenizer, device: torch.device, dtype: torch.dtype, path=None,
                 quantization: str | None = None, quantized_head: bool = False):
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
        self.name = str(path) if path is not None else None  # what it was loaded by (folder, hub id, random:...)
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
    def forward(self, input_ids, attention_mask=None, *, mode="full", cache=None, start=0, end=None, rows=None,
                skip: EarlySkip | None = None, real_from: list[int] | None = None,
                attention_block: int | None = None, fold: int = 0, columns=None, block_at=None, elastic=None,
                sub_block=None):
        """Float32 logits [R, end-start, V] for positions [start, end) of the
        selected rows (all rows by default). input_ids / attention_mask are the
        full [B, L] canvas (mask: 1 = real token, left padding).

        mode="full":   computes every position; fills ``cache`` if given.
        mode="prefix": computes [start, L); K/V of [0, start) from the cache.
        mode="dual":   computes [start, end) and writes their K/V into the
                       cache; every other position's K/V comes from the cache.
        mode="es":     dual with early skipping (models/skip.py): past each
                       group boundary of ``skip.schedule`` only the most
                       important block positions go on; a skipped position's
                       K/V at later layers and its final hidden state come
                       from the cache, which must be made with
                       new_cache(..., skip_schedule=...). ``skip`` carries
                       the previous step's view and receives the work done.
        mode="dkv":    (engine only) dKV-Cache: computes ``columns`` [R, n] (see forward_columns);
                       ``block_at`` [R, end-start] says which of them each block position is.
        mode="elastic": (engine only) Elastic-Cache: ``elastic`` (models/elastic.ElasticInputs).
        mode="subblock": (engine only) Fast-dLLM v2's within-block cache: ``sub_block``
                       (models/sub_block.SubBlockInputs) on a block-causal model.
        mode="verify": (engine only) WINO: [R, 2 (end-start), V], the block's logits then its
                       shadow block's (models/shadow.py); no cache.
        mode="block":  block-causal models only, the exact block cache: computes [start, end)
                       (and the ``fold`` positions left of start, a just-completed block whose
                       final K/V are written here once) against the cache, whose K/V of every
                       earlier block are final; later blocks are never read.
        (Dream also computes start-1 in prefix/dual/es mode: it predicts start.)
        ``start`` and ``end`` may also be lists with one int per selected row, with
        the same end - start for every row: rows at different blocks share the
        forward (the step-level engine does this), each as it would run alone.
        ``real_from`` (each selected row's first real column, the rows left-padded) is
        for a caller that checked its inputs once and vouches for them (the engine, whose
        requests are checked at submit): the checks and their host syncs are then skipped
        (forward_unchecked; start / end must be lists, rows None, a slice or a device tensor).
        ``attention_block``: block-causal models only, the block length of their attention (blocks
        laid from each row's first real token); None = the model's default (layers.default_attention_block).
        """
        if mode in (ForwardMode.DKV, ForwardMode.VERIFY, ForwardMode.ELASTIC, ForwardMode.SUBBLOCK):
            if real_from is None:
                raise InputError(f"mode={mode!r} is the engine's; call forward_columns / forward_elastic / "
                                 "forward_with_attention / sub_block.forward_sub_block")
            r = slice(None) if rows is None else rows
            if mode == ForwardMode.SUBBLOCK:
                return forward_sub_block(self, input_ids, cache, sub_block, attention_block, rows, real_from)
            if mode == ForwardMode.ELASTIC:
                logits = self.forward_elastic(input_ids, cache, elastic, rows=rows, real_from=real_from)
                return logits.gather(1, elastic.block_at[..., None].expand(-1, -1, logits.shape[-1]))
            if mode == ForwardMode.DKV:
                logits = self.forward_columns(input_ids, cache, columns, rows=rows, real_from=real_from)
                return logits.gather(1, block_at[..., None].expand(-1, -1, logits.shape[-1]))
            canvases = [row[first:] for row, first in zip(input_ids[r], real_from)]
            return shadow_forward(self, canvases, [s - f for s, f in zip(start, real_from)], end[0] - start[0])
        if real_from is not None:
            return self.forward_unchecked(input_ids, attention_mask, mode=mode, cache=cache, starts=start,
                                          length=end[0] - start[0], rows=rows, real_from=real_from, skip=skip,
                                          attention_block=attention_block, fold=fold)
        attention_block = self._check_attention_block(attention_block)
        if mode == "block" and not self.config.block_causal:
            raise InputError(f"mode='block' (the exact block cache) needs a block-causal model; the "
                             f"{self.config.family} model's attention is bidirectional")
        if fold and mode != "block" or not isinstance(fold, int) or fold < 0:
            raise InputError(f"fold={fold!r}: a non-negative int, and only with mode='block'")
        if mode not in MODES:
            raise InputError(f"unknown forward mode {mode!r}; expected one of {MODES}")
        if (mode == "es") != (skip is not None):
            raise InputError(f"mode={mode!r} with skip={type(skip).__name__}: "
                             "an EarlySkip goes with mode='es' and only with it")
        ids, mask = self._check_canvas(input_ids, attention_mask)
        B, L = ids.shape
        rows = self._check_rows(rows, B)
        r = slice(None) if rows is None else rows
        R = B if rows is None else len(rows)
        starts, length = _check_range(start, end, L, R)
        extra = 0 if mode == "full" else self.model.extra_left + fold
        if min(starts) < extra:
            raise InputError(f"mode={mode!r}: start must be >= {extra} for this model (it predicts position "
                             f"start from the hidden state of start - 1); got start={min(starts)}")
        if cache is not None:
            self._check_cache(cache, B, L)
        if mode != "full":
            if cache is None:
                raise InputError(f"mode={mode!r} needs a cache filled by a full forward; got cache=None")
            if not bool(cache.filled[r].all()):
                raise InputError(f"mode={mode!r}: the cache has rows never filled by a full forward (rows={rows})")
            if not torch.equal(cache.attention_mask[r], mask[r]):
                raise InputError(f"mode={mode!r}: attention_mask differs from the one the cache was filled with")
        if mode == "es":
            self._check_skip(skip, cache, R, length)
        return self.forward_unchecked(ids, mask, mode=mode, cache=cache, starts=starts, length=length, rows=rows,
                                      real_from=_left_padding(mask[r]), skip=skip, attention_block=attention_block,
                                      fold=fold)

    @torch.no_grad()
    def forward_unchecked(self, ids, mask, *, mode: str, cache, starts: list[int], length: int, rows,
                          real_from: list[int] | None, skip: EarlySkip | None = None,
                          attention_block: int | None = None, fold: int = 0):
        """forward() without its argument checks and without any host sync: for a caller that
        checked its inputs once (the engine checks each request when it is submitted) and
        knows each row's first real column (``real_from``; the Frame's rows are left-padded).
        ids, mask: [B, L] on the model's device; starts: each selected row's block start
        (host ints); rows: None (all), a slice (contiguous rows: the cache is read as a view)
        or a long tensor on the device."""
        r = slice(None) if rows is None else rows
        extra = 0 if mode == "full" else self.model.extra_left + fold
        if mode == "full" and cache is None and attention_block and starts:
            # Block-causal, no cache: the window is the blocks up to the rows' current ones (as the
            # official loops recompute it); later positions are never seen by these.
            ids, mask = ids[:, :max(starts) + length], mask[:, :max(starts) + length]
        if mode == "full":
            mask_r = mask[r]
            pos_r = positions_from_mask(mask_r)
            if cache is not None:
                cache.attention_mask[r] = mask_r
                cache.positions[r] = pos_r
                cache.filled[r] = True
        else:
            mask_r, pos_r = cache.attention_mask[r], cache.positions[r]

        c = self.config
        plan = keep_counts(skip.schedule, c.n_layers, length) if mode == "es" else None
        start_t = to_device(starts, self.device)
        ctx = Context.build(mask_r, pos_r, c.rotary_dim, c.rope_theta, mode=mode, starts=start_t, block_length=length,
                            extra=extra, rows=rows, cache=cache, skip=skip, plan=plan, real_from=real_from,
                            start_list=starts, attention_block=attention_block or default_attention_block(c))
        if ctx.index is not None:
            computed_ids = ids[r].gather(1, ctx.index)
        else:
            computed_ids = ids[r][:, ctx.lo:]
        logits = self.model(computed_ids, ctx)
        if skip is not None:
            skip.computed_pairs, skip.full_pairs = sum(plan), c.n_layers * length
            skip.kept = ctx.index[:, extra:] - start_t[:, None]
        return logits

    forward_elastic = forward_elastic  # Elastic-Cache's forward (models/elastic.py)

    @torch.no_grad()
    def forward_columns(self, ids, cache: KVCache, columns: torch.Tensor, rows=None,
                        real_from: list[int] | None = None) -> torch.Tensor:
        """dKV-Cache's forward (mode "dkv", decode/forward_modes.py): float32 logits [R, n, V] of ``columns``
        [R, n] (absolute, ascending per row) of the selected rows of the canvas ``ids`` [B, L]; their
        K/V are computed and written into ``cache`` (filled by a full forward), every other
        column's K/V are read from it. Families with a logit shift (Dream) cannot run it."""
        if self.model.extra_left:
            raise InputError(f"the dkv forward needs unshifted logits; family {self.config.family!r} predicts "
                             "position i from i - 1")
        r = slice(None) if rows is None else rows
        c = self.config
        ctx = Context.build(cache.attention_mask[r], cache.positions[r], c.rotary_dim, c.rope_theta, mode="dkv",
                            rows=rows, cache=cache, real_from=real_from, columns=columns)
        return self.model(ids[r].gather(1, columns), ctx)

    @torch.no_grad()
    def forward_with_attention(self, ids: torch.Tensor, positions: torch.Tensor, attention: torch.Tensor,
                               targets: torch.Tensor) -> torch.Tensor:
        """Float32 logits [R, k, V] at columns ``targets`` [R, k] of a canvas ``ids`` [R, n] whose
        RoPE ``positions`` [R, n] and query-by-key ``attention`` [R, 1, n, n] (bool, True = attends)
        the caller gives: no padding, no cache. For decoders whose forward is not a plain canvas
        (WINO's shadow block, models/shadow.py); the logits are position-aligned only for
        families without a shift (Dream predicts i from i - 1: the caller must not use it there)."""
        c = self.config
        ctx = Context.build(torch.ones_like(ids, dtype=torch.bool), positions, c.rotary_dim, c.rope_theta)
        ctx.key_mask, ctx.targets = attention, targets
        return self.model(ids, ctx)

    def _check_attention_block(self, attention_block):
        c = self.config
        if attention_block is None:
            return default_attention_block(c)
        if not c.block_causal:
            raise InputError(f"attention_block={attention_block!r}: the {c.family} model's attention is "
                             "bidirectional (not block-causal)")
        if not isinstance(attention_block, int) or isinstance(attention_block, bool) or attention_block < 1:
            raise InputError(f"attention_block must be a positive integer, got {attention_block!r}")
        if c.block_lengths and attention_block not in c.block_lengths:
            raise InputError(f"block length {attention_block} is not one this model decodes with "
                             f"(allowed: {', '.join(map(str, c.block_lengths))})")
        return attention_block

    def new_cache(self, batch_size: int, length: int, *, skip_schedule=None, every_layer: bool = False) -> KVCache:
        """An empty cache for a [batch_size, length] canvas; fill it with mode="full".
        With an early-skip schedule it also keeps the hidden states mode="es" reads; with
        every_layer, those of every layer's input (mode="elastic")."""
        c = self.config
        levels = tuple(range(c.n_layers)) if every_layer else ()
        if skip_schedule is not None:
            levels = hidden_levels(check_schedule(skip_schedule, "skip_schedule"), c.n_layers)
        for name, value in (("batch_size", batch_size), ("length", length)):
            if not isinstance(value, int) or value <= 0:
                raise InputError(f"new_cache: {name} must be a positive int, got {value!r}")
        if length > c.max_length:
            raise InputError(f"new_cache: length {length} exceeds the model's max_length {c.max_length}")
        return KVCache.allocate(c.n_layers, batch_size, c.n_kv_heads, length, c.head_dim, self.device, self.dtype,
                                hidden_levels=levels, hidden_size=c.hidden_size)

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

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation ([{"role", "content"}, ...]) through the chat
        template, ending with the assistant generation prompt."""
        if not self.tokenizer.chat_template:
            raise InputError(f"{self.name or self.path} has no chat template (its tokenizer_config.json has no "
                             "chat_template: a base model?); decode the prompt as raw text with chat=False "
                             "(--no-chat on the command line)")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        """Text of `ids`, special tokens (mask, eos, end of turn) left out."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        n = len(self.tokenizer)
        # Padding rows of the embedding (ids past the tokenizer) have no text.
        return self.tokenizer.decode([i for i in ids if 0 <= i < n], skip_special_tokens=True)

    # ---- checks ---------------------------------------------------------

    def _check_canvas(self, input_ids, attention_mask):
        try:
            ids = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"input_ids must be an integer tensor [B, L]: {e}") from None
        if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise InputError(f"input_ids must be an integer tensor [B, L]; got dtype {ids.dtype}, shape {tuple(ids.shape)}")
        B, L = ids.shape
        if B == 0 or L == 0:
            raise InputError(f"input_ids is empty: shape {tuple(ids.shape)}")
        if L > self.config.max_length:
            raise InputError(f"sequence length {L} exceeds the model's max_length {self.config.max_length}")
        ids = ids.to(self.device, torch.long)
        V = self.config.vocab_size
        bad = (ids < 0) | (ids >= V)
        if bool(bad.any()):
            raise InputError(f"token id {int(ids[bad][0])} is outside the vocabulary (size {V}, ids 0..{V - 1})")

        if attention_mask is None:
            return ids, torch.ones_like(ids, dtype=torch.bool)
        try:
            mask = torch.as_tensor(attention_mask)
        except (TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"attention_mask must be a [B, L] tensor of 0/1: {e}") from None
        if tuple(mask.shape) != (B, L):
            raise InputError(f"attention_mask shape {tuple(mask.shape)} does not match input_ids shape {(B, L)}")
        mask = mask.to(self.device) != 0
        empty = ~mask.any(dim=1)
        if bool(empty.any()):
            raise InputError(f"attention_mask row {int(empty.nonzero()[0])} has no real token")
        return ids, mask

    def _check_rows(self, rows, B):
        if rows is None:
            return None
        rows = torch.as_tensor(rows)
        if rows.dim() != 1 or rows.numel() == 0 or rows.dtype.is_floating_point or rows.dtype == torch.bool:
            raise InputError(f"rows must be a non-empty 1-D integer tensor; got dtype {rows.dtype}, shape {tuple(rows.shape)}")
        if int(rows.min()) < 0 or int(rows.max()) >= B:
            raise InputError(f"rows {rows.tolist()} out of range for batch size {B}")
        if rows.unique().numel() != rows.numel():
            raise InputError(f"rows {rows.tolist()} contains duplicates")
        return rows.to(self.device, torch.long)

    def _check_skip(self, skip, cache, rows, block_length) -> None:
        """Validate an EarlySkip for this call (and move its tensors to the model's device)."""
        if not isinstance(skip, EarlySkip):
            raise InputError(f"skip must be an EarlySkip, got {type(skip).__name__}")
        skip.check(rows, block_length)
        needed = hidden_levels(skip.schedule, self.config.n_layers)
        missing = [level for level in needed if level not in cache.hidden]
        if missing:
            raise InputError(f"mode='es': the cache keeps no hidden states at layers {missing}; "
                             "make it with new_cache(..., skip_schedule=<the same schedule>)")
        skip.prev_confidence = skip.prev_confidence.to(self.device)
        skip.just_committed = skip.just_committed.to(self.device)
        skip.masked = skip.masked.to(self.device)

    def _check_cache(self, cache, B, L):
        if not isinstance(cache, KVCache):
            raise InputError(f"cache must be a KVCache from new_cache(), got {type(cache).__name__}")
        if (cache.batch_size, cache.length) != (B, L) or len(cache.keys) != self.config.n_layers:
            raise InputError(
                f"cache was made for a [{cache.batch_size}, {cache.length}] canvas with {len(cache.keys)} layers; "
                f"input is [{B}, {L}] for a {self.config.n_layers}-layer model"
            )


def _left_padding(mask: torch.Tensor) -> list[int] | None:
    """Each row's first real column when every row is left-padded (real tokens
    contiguous up to the end); None otherwise (attention then uses the mask)."""
    first = (~mask).sum(dim=1)
    columns = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask, columns >= first[:, None]):
        return None
    return first.tolist()


def _check_range(start, end, L, rows):
    """Each selected row's block start, and the block length (the same for every row).
    start / end: ints, or one int per selected row."""
    starts, ends = (_int_list(start, rows, "start"), _int_list(L if end is None else end, rows, "end"))
    for s, e in zip(starts, ends):
        if not 0 <= s < e <= L:
            raise InputError(f"start={s}, end={e} out of range for canvas length {L} (need 0 <= start < end <= L)")
    lengths = {e - s for s, e in zip(starts, ends)}
    if len(lengths) > 1:
        raise InputError(f"end - start must be the same for every row, got lengths {sorted(lengths)}")
    return starts, lengths.pop()


def _int_list(value, rows: int, name: str) -> list[int]:
    try:
        if isinstance(value, (list, tuple)):
            values = [operator.index(v) for v in value]
        else:
            values = [operator.index(value)] * rows
    except TypeError:
        raise InputError(f"{name} must be an int or a list of ints (one per selected row), got {value!r}") from None
    if len(values) != rows:
        raise InputError(f"{name} has {len(values)} values for {rows} selected rows")
    return values
