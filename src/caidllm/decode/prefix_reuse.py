"""The engine's side of the prefix store (decode/prefix_store.py): the budget, and a request's blocks
in and out of its slot.

At admission a request of an exact block cache (``block``, or Fast-dLLM v2's ``subblock`` over it: its
earlier blocks are the exact cache's, folded with their final tokens) takes the longest chain of stored
blocks that matches its prompt's complete blocks (those before the block holding the prompt's end), copies
their keys and values into its cache row, and its first forward is a block forward that computes only the rest
of the prompt (the cache mode's ``fold``, decode/caches/exact.py) instead of the full forward. After that
first forward its prompt's complete blocks go into the store, and when it finishes every block whose final
keys and values its row holds (prompt and generated blocks, the last one excepted: its keys were never
recomputed from its final tokens) goes in too, so that a chat's next turn finds its history. The request holds
(pins) the blocks it took or wrote until it leaves; a cancelled or failed request writes nothing more.
"""

from __future__ import annotations

import math
import os

import torch

from caidllm.checks import is_number
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.prefix_store import PrefixStore, chain_digests
from caidllm.errors import InputError
from caidllm.models.layers import positions_from_mask
from caidllm.models.moe import MoEFeedForward

DEFAULT_MB = 1024  # the default budget, cut to an eighth of the device's memory on a small machine
MB = 1 << 20


def device_memory_mb(device) -> float:
    """The device's total memory in MB (CPU: the machine's physical memory)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / MB
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MB
    except (ValueError, OSError, AttributeError):
        return math.inf


def check_budget(value, what: str = "prefix_cache_mb") -> float | None:
    """A budget as given (None = the default): a finite number >= 0 of MB, else InputError naming it."""
    if value is None:
        return None
    given = value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            value = None
    if not is_number(value) or value < 0:
        raise InputError(f"{what} must be a number of MB >= 0 (0 turns the prefix cache off), got {given!r}")
    return float(value)


def make_store(lm, prefix_cache_mb=None) -> PrefixStore | None:
    """The store an engine on `lm` uses: None when off (budget 0, or a full-sequence model left at the
    default); a budget the model cannot use raises InputError naming why."""
    mb = check_budget(prefix_cache_mb)
    c = lm.config
    if not c.block_causal:
        if mb:
            raise InputError(
                f"prefix_cache_mb={mb:g}: the prefix cache does not apply to the {c.family} model: "
                "its attention is bidirectional, so a prompt's keys and values depend on the tokens "
                "after it and are never final (it needs a block-causal model: LLaDA2, SDAR, tiny-bd)"
            )
        return None
    if getattr(lm, "tp", None) is not None:  # a tensor-parallel model (parallel/sharding.py)
        # Each rank would hold its own store, and rank 0's kept across generate() calls would let it
        # reuse blocks its followers recompute: their forwards (and collectives) would no longer match.
        if mb:
            raise InputError(
                f"prefix_cache_mb={mb:g}: the prefix cache does not work with --tp yet "
                "(give --prefix-cache-mb 0 or leave it unset)"
            )
        return None
    total = device_memory_mb(lm.device)
    if mb is not None and mb > total:
        raise InputError(
            f"prefix_cache_mb={mb:g} is more than the memory of device {lm.device} ({total:.0f} MB)"
        )
    if mb is None:
        mb = min(DEFAULT_MB, total / 8)
    return adopt(PrefixStore(int(mb * MB)), lm) if mb > 0 else None


def adopt(store: PrefixStore, lm) -> PrefixStore:
    """`store` for an engine on `lm`: a new one takes the model's arithmetic (numerics); one filled by another
    model, or by this one with other kernels, is refused (its blocks would be another model's keys)."""
    if not store.numerics:
        store.numerics = numerics(lm)
    elif store.numerics != numerics(lm):
        raise InputError(
            "prefix_store was made for another model (or this one with other kernels: dtype, "
            "quantization, compile); its blocks are not this model's keys and values"
        )
    return store


def shared_store(lm, prefix_cache_mb=None) -> PrefixStore | None:
    """The store kept with the model across generate() calls (bench batches, lm-eval batches, chat turns):
    made on first use, made again when the budget asked for changes or when the model's arithmetic did
    (compile=True swaps kernels in: blocks computed by the eager ones would not be those it computes)."""
    mb = check_budget(prefix_cache_mb)
    held = getattr(lm, "prefix_store", None)
    if (
        held is not None
        and (mb is None or int(mb * MB) == held.budget_bytes)
        and held.numerics == numerics(lm)
    ):
        return held
    store = make_store(lm, mb)
    lm.prefix_store = store
    return store


def numerics(lm) -> tuple:
    """What a block's keys and values depend on besides its tokens and block length: the model (its weights)
    and its arithmetic (dtype and quantization are fixed at load; compile=True and set_moe_kernel swap
    kernels in later, and MoE kernels sum in different orders)."""
    model = getattr(lm, "model", lm)
    moe_kernels = (
        tuple(m.kernel for m in model.modules() if isinstance(m, MoEFeedForward))
        if isinstance(model, torch.nn.Module)
        else ()
    )
    return (
        id(model),
        str(getattr(lm, "dtype", None)),
        getattr(lm, "quantization", None),
        bool(getattr(lm, "compiled", False)),
        moe_kernels,
    )


def forget_store(lm) -> None:
    """Drop the store kept with the model: the next generate() starts with an empty one (bench rows)."""
    lm.prefix_store = None


def prompt_blocks(request) -> int:
    """The prompt's complete blocks before its first decoded block."""
    return (len(request.prompt) - request.layout.lead) // request.config.block_length


class PrefixReuse:
    """The store as the engine's loop uses it (None: off)."""

    def __init__(self, store: PrefixStore | None):
        self.store = store

    def applies(self, request) -> bool:
        """A request of an exact block cache whose keys and values are block-causal ones (not S2D2's
        AR-like caching: its stored blocks would not be the ones it computes)."""
        return (
            self.store is not None
            and request.block_causal
            and CACHE_MODES[request.config.cache].exact
            and request.config.policy_settings.causal_span() is None
        )

    def admit(self, frame, request) -> None:
        """A request took its slot: copy the longest stored chain of its prompt into its row."""
        if not self.applies(request):
            return
        store, bl = self.store, request.config.block_length
        digests = chain_digests(request.prompt, bl, prompt_blocks(request))
        found = store.match(digests)
        digests = digests[: len(found)]
        store.counters.lookups += 1
        if found:
            _load_row(frame, request.slot, found)
            store.pin(digests)
            request.pinned.extend(digests)
            request.reused = len(found) * bl
            store.counters.hits += 1
            store.counters.blocks_reused += len(found)
            store.counters.positions_saved += request.reused
        store.counters.positions_prefilled += len(request.prompt) - request.reused

    def after_forward(self, frame, request) -> None:
        """A request's forward ran (before its bookkeeping): its prompt's blocks go in after the first;
        every block before the current one is final from the current block's first step on."""
        if not self.applies(request):
            return
        if request.nfe == 0:
            self.publish(frame, request, prompt_blocks(request))
        request.final_blocks = prompt_blocks(request) + request.block

    def finish(self, frame, request) -> None:
        """A request finished (still in its slot): its final blocks go in, then it lets go of its blocks."""
        if self.applies(request):
            self.publish(frame, request, request.final_blocks)
        self.release(request)

    def release(self, request) -> None:
        """A request leaves (finished, cancelled, failed, dropped): its pins go."""
        if self.store is not None and request.pinned:
            self.store.unpin(request.pinned)
            request.pinned = []

    def publish(self, frame, request, blocks: int) -> None:
        """Store the first `blocks` blocks of the request's row (those stored already are touched). Stops
        at the first block without room: a block whose parent is missing could never be matched."""
        if blocks <= 0:
            return
        bl, slot = request.config.block_length, request.slot
        first = frame.first_real(slot)
        tokens = (request.prompt + request.generated)[: blocks * bl]  # the row's tokens, known on the host
        if None in tokens:  # never for a final block; read the canvas rather than guess
            tokens = frame.canvas[slot, first : first + blocks * bl].tolist()
        digests = chain_digests(tokens, bl, blocks)
        missing = [b for b, d in enumerate(digests) if d not in self.store.blocks]
        self.store.touch(digests)
        if not missing:
            return
        lo = missing[0]
        keys, values = _read_row(frame, slot, first + lo * bl, first + blocks * bl)
        held = set(request.pinned)
        for b in range(lo, blocks):
            at = slice((b - lo) * bl, (b - lo + 1) * bl)
            if not self.store.put(digests[b], keys[:, :, at], values[:, :, at]):
                break
            if digests[b] not in held:  # held until the request leaves: its next blocks cannot evict it
                self.store.pin([digests[b]])
                request.pinned.append(digests[b])
        self.store.touch(digests)  # the chain's first blocks most recent again: its last ones go first


def _load_row(frame, slot: int, blocks) -> None:
    """Write stored blocks at the start of a slot's cache row and mark the row filled (its mask and
    positions are those a full forward would have written)."""
    cache, first = frame.cache, frame.first_real(slot)
    n = sum(b.keys.shape[2] for b in blocks)
    keys = torch.cat([b.keys for b in blocks], dim=2)
    values = torch.cat([b.values for b in blocks], dim=2)
    for layer in range(len(cache.keys)):
        for k, v in cache.layer_tensors(layer):
            k[slot, :, first : first + n] = keys[layer]
            v[slot, :, first : first + n] = values[layer]
    mask = frame.attention[slot : slot + 1]
    cache.attention_mask[slot] = mask[0]
    cache.positions[slot] = positions_from_mask(mask)[0]
    cache.filled[slot] = True


def _read_row(frame, slot: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of columns [lo, hi) of a slot's cache row, every layer: [n_layers, H, hi - lo, D]."""
    cache = frame.cache
    return (
        torch.stack([k[slot, :, lo:hi] for k in cache.keys]),
        torch.stack([v[slot, :, lo:hi] for v in cache.values]),
    )
