"""A memory plan for serving a model over N GPUs with tensor parallelism (``caidllm models --plan``):
the weight bytes each rank holds, the KV cache bytes one request needs at a context, and how
many requests fit beside the weights, from the parameter counts of the module built on the
meta device (nothing is read but config.json).

What each rank holds follows ``--tp``'s sharding (parallel/sharding.py): the attention
projections, the dense feed-forwards (the shared expert too) and the routed experts are
divided among the ranks (every weight matrix inside a decoder layer); the embeddings, the
output head, the norms and the routers stay whole on every rank (replicated). The key/value
heads are divided too, so each rank caches its share of every request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..errors import InputError
from .families import get_family
from .inventory import DTYPE_BYTES, cache_bytes
from .moe import Router
from .quantize import decoder_layers

USABLE = 0.9  # share of a GPU's memory given to weights and caches (the rest: activations, CUDA context)
GIB = 2**30
CACHE_NOTES = {
    "dual": "dual cache; the prefix cache needs twice that",
    "block": "block cache",
    "canvas": "canvas cache: the prompt and finished canvases, every layer, V = K stored apart",
}


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    tp: int
    dtype: str
    gpu_memory_gib: float
    context: int
    sharded_parameters: int  # divided among the ranks (all ranks together)
    replicated_parameters: int  # whole on every rank
    weights_bytes_per_rank: int
    kv_bytes_per_request_per_rank: (
        int  # keys and values of every layer at `context` positions (dual / block cache)
    )
    cache_budget_bytes_per_rank: int  # USABLE x the GPU's memory, less the weights
    requests_that_fit: int
    cache: str = "dual"  # the cache mode the KV figure is of (cache_bytes' key: dual, block, canvas)

    def to_dict(self) -> dict:
        return asdict(self)


def check_tp_divides(tp: int, config) -> None:
    """Each rank must hold an equal share of the heads, key/value heads, feed-forward widths and experts."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"--tp must be a positive integer, got {tp!r}")
    sizes = [("attention heads", config.n_heads), ("key/value heads", config.n_kv_heads)]
    if config.intermediate_size and (config.moe is None or config.dense_layers):
        sizes.append(("feed-forward width (intermediate_size)", config.intermediate_size))
    if config.moe is not None:
        sizes.append(("experts (num_experts)", config.moe.num_experts))
        if config.moe.num_shared_experts:
            sizes.append(
                ("shared-expert width", config.moe.moe_intermediate_size * config.moe.num_shared_experts)
            )
    family = get_family(config.family)
    if family.tp_sizes is not None:
        sizes += family.tp_sizes(config)
    for what, size in sizes:
        if size % tp:
            raise InputError(
                f"--tp {tp} does not divide the model's {size} {what}: each rank must hold an "
                f"equal share (a --tp that divides {size})"
            )


def split_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(sharded, replicated) parameter counts: every weight matrix inside a decoder layer but the
    routers' is sharded; embeddings, head, norms, routers and vectors are replicated."""
    _, layers = decoder_layers(model)
    routers = {
        id(p)
        for m in model.modules()
        if isinstance(m, Router) or getattr(m, "is_router", False)
        for p in m.parameters()
    }
    in_layers = {
        id(p) for layer in layers for p in layer.parameters() if p.dim() >= 2 and id(p) not in routers
    }
    sharded = replicated = 0
    seen = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in in_layers:
            sharded += p.numel()
        else:
            replicated += p.numel()
    return sharded, replicated


def memory_plan(described, tp: int, dtype: torch.dtype, gpu_memory_gib: float, context: int) -> MemoryPlan:
    """The plan for `described` (inventory.describe: a meta-device model) over `tp` GPUs of
    `gpu_memory_gib` GiB each, requests of `context` positions."""
    config = described.config
    check_tp_divides(tp, config)
    if (
        isinstance(gpu_memory_gib, bool)
        or not isinstance(gpu_memory_gib, (int, float))
        or not gpu_memory_gib > 0
    ):
        raise InputError(f"--gpu-memory must be a positive number of GiB, got {gpu_memory_gib!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InputError(f"--context must be a positive number of positions, got {context!r}")
    size = DTYPE_BYTES[dtype]
    sharded, replicated = split_parameters(described.model)
    weights = (sharded // tp + replicated) * size
    # every layer's keys and values once: the dual cache, or a block-causal model's exact block cache
    modes = cache_bytes(config, context, dtype)
    mode = next(m for m in ("canvas", "kv", "block" if config.block_causal else "dual") if m in modes)
    kv = modes[mode] // tp
    budget = int(USABLE * gpu_memory_gib * GIB) - weights
    return MemoryPlan(
        model=described.name,
        tp=tp,
        dtype=str(dtype).removeprefix("torch."),
        gpu_memory_gib=gpu_memory_gib,
        context=context,
        sharded_parameters=sharded,
        replicated_parameters=replicated,
        weights_bytes_per_rank=weights,
        kv_bytes_per_request_per_rank=kv,
        cache_budget_bytes_per_rank=budget,
        requests_that_fit=max(budget, 0) // kv if kv else 0,
        cache=mode,
    )


def plan_lines(plan: MemoryPlan) -> list[str]:
    weights, kv, budget = (
        plan.weights_bytes_per_rank / GIB,
        plan.kv_bytes_per_request_per_rank / GIB,
        plan.cache_budget_bytes_per_rank / GIB,
    )
    lines = [
        f"{plan.model}: tp {plan.tp}, {plan.dtype}, {plan.gpu_memory_gib:g} GiB per GPU, "
        f"requests of {plan.context} positions",
        f"weights per rank: {weights:.2f} GiB ({plan.sharded_parameters / 1e9:.2f}B parameters divided among "
        f"the ranks: attention, feed-forwards, experts; {plan.replicated_parameters / 1e9:.2f}B on every "
        "rank: "
        "embeddings, head, norms, routers)",
        f"KV cache per request per rank: {kv:.3f} GiB ({CACHE_NOTES[plan.cache]})",
    ]
    if budget <= 0:
        lines.append(
            f"does not fit: {USABLE:.0%} of {plan.gpu_memory_gib:g} GiB is "
            f"{USABLE * plan.gpu_memory_gib:.1f} GiB, less than the weights"
        )
    else:
        lines.append(
            f"requests that fit: {plan.requests_that_fit} ({USABLE:.0%} of the GPU for weights and caches: "
            f"{budget:.1f} GiB left for caches per rank)"
        )
    return lines
