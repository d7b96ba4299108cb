"""Mixture-of-experts feed-forward layer, its routing given by configuration.

One module serves every MoE family caidllm knows:
- LLaDA2.0 / LLaDA2.1 (inclusionAI): sigmoid scores, an expert score bias used for the
  choice only, group-limited top-k (n_group / topk_group, a group scored by the sum of
  its two best experts), normalised top-k weights, a routed scaling factor, one shared expert;
  LLaDA2.2 the same with block routing in place of the groups (moe_block_routing.py);
- LLaDA-MoE-7B-A1B (OLMoE layout): softmax over 64 experts, top-8, weights not normalised;
- SDAR-30B-A3B (Qwen3-MoE layout): softmax over 128 experts, top-8, weights normalised.

Routing works on the whole batch of tokens at once; the routed experts' weights are
stacked ([experts, out, in] per projection, moe_experts.py) and run by a kernel chosen per
device (moe_kernels.py: grouped matmuls by default, the per-expert loop as the reference).
State-dict names follow the official checkpoints: ``gate.weight`` [experts, hidden] (and
``gate.expert_bias`` [experts] where the config has one), ``experts.{e}.{gate,up,down}_proj``
and ``shared_experts.{gate,up,down}_proj``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ModelLoadError
from .moe_block_routing import context_groups, flat_groups, pool_only
from .moe_experts import ExpertMLP, StackedExperts
from .moe_kernels import AUTO, check_kernel, run_experts

# Score functions by their config.json name (LLaDA2's "score_function").
SCORE_FUNCTIONS = {
    "softmax": lambda logits: logits.softmax(dim=-1),
    "sigmoid": torch.sigmoid,
}


@dataclass(frozen=True)
class MoEConfig:
    """Sizes and routing of one MoE layer; field names are the official config.json ones.

    num_experts_per_tok experts are chosen per token among num_experts. With n_group > 1
    the experts form n_group equal groups, each scored by the sum of its ``group_top``
    best scores, and only the topk_group best groups are eligible (DeepSeek-V3 / LLaDA2).
    The expert bias (moe_router_enable_expert_bias) is added to the scores for the choice
    only; the weights come from the unbiased scores, normalised to sum 1 when
    norm_topk_prob, then multiplied by routed_scaling_factor. num_shared_experts > 0 adds
    one SwiGLU of that many times moe_intermediate_size, applied to every token.
    """

    hidden_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    score_function: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    group_top: int = 2
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    expert_bias: bool = False
    num_shared_experts: int = 0
    # Router logits from fp32 inputs and weights (LLaDA2's router_dtype "fp32"); else in the model dtype.
    router_fp32: bool = True
    # LLaDA2.2's block routing (moe_block_routing.py): each block of block_size positions admits
    # expert_capacity experts, each token its top-k among them; 0 = token routing (the groups above).
    expert_capacity: int = 0
    block_size: int = 0

    def __post_init__(self):
        if self.score_function not in SCORE_FUNCTIONS:
            raise ModelLoadError(
                f"MoE routing: unknown score_function={self.score_function!r}; "
                f"expected one of {sorted(SCORE_FUNCTIONS)}"
            )
        for name in (
            "hidden_size",
            "moe_intermediate_size",
            "num_experts",
            "num_experts_per_tok",
            "n_group",
            "topk_group",
            "group_top",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"MoE routing: {name}={value!r} must be a positive integer")
        if (
            isinstance(self.num_shared_experts, bool)
            or not isinstance(self.num_shared_experts, int)
            or self.num_shared_experts < 0
        ):
            raise ModelLoadError(
                f"MoE routing: num_shared_experts={self.num_shared_experts!r} must be a non-negative integer"
            )
        if self.num_experts % self.n_group:
            raise ModelLoadError(
                f"MoE routing: num_experts={self.num_experts} is not divisible "
                f"into n_group={self.n_group} groups"
            )
        if self.topk_group > self.n_group:
            raise ModelLoadError(f"MoE routing: topk_group={self.topk_group} exceeds n_group={self.n_group}")
        per_group = self.num_experts // self.n_group
        if self.n_group > 1 and self.group_top > per_group:
            raise ModelLoadError(
                f"MoE routing: group_top={self.group_top} exceeds the {per_group} experts of a group"
            )
        if self.num_experts_per_tok > self.topk_group * per_group:
            raise ModelLoadError(
                f"MoE routing: num_experts_per_tok={self.num_experts_per_tok} exceeds the "
                f"{self.topk_group * per_group} experts eligible (topk_group={self.topk_group} groups "
                f"of {per_group})"
            )
        self._check_block_routing()
        scale = self.routed_scaling_factor
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or scale <= 0
        ):
            raise ModelLoadError(f"MoE routing: routed_scaling_factor={scale!r} must be a positive number")

    def _check_block_routing(self) -> None:
        for name in ("expert_capacity", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ModelLoadError(f"MoE routing: {name}={value!r} must be a non-negative integer")
        if not self.expert_capacity:
            return
        if not self.num_experts_per_tok <= self.expert_capacity <= self.num_experts:
            raise ModelLoadError(
                f"MoE routing: expert_capacity={self.expert_capacity} (the block's expert pool) must be "
                f"in num_experts_per_tok..num_experts ({self.num_experts_per_tok}..{self.num_experts})"
            )
        if self.block_size < 1:
            raise ModelLoadError("MoE routing: block_size must be positive where expert_capacity is set")

    @property
    def active_experts(self) -> int:
        """Expert SwiGLUs that run per token (routed and shared)."""
        return self.num_experts_per_tok + (1 if self.num_shared_experts else 0)


def route(
    logits: torch.Tensor,
    config: MoEConfig,
    bias: torch.Tensor | None = None,
    groups: torch.Tensor | None = None,
):
    """Chosen experts and their weights for router logits [T, E] (fp32 recommended); groups [T]: each
    token's block where the config routes by blocks (None: consecutive runs of block_size tokens).

    Returns (experts [T, k] long, weights [T, k] in the logits' dtype)."""
    scores = SCORE_FUNCTIONS[config.score_function](logits)
    for_choice = scores if bias is None else scores + bias
    if config.expert_capacity:  # block routing replaces the groups (the released LLaDA2.2 gate)
        if groups is None:
            groups = flat_groups(logits.shape[0], config.block_size).to(logits.device)
        for_choice = pool_only(for_choice, groups, config.expert_capacity)
    elif config.n_group > 1:
        for_choice = _eligible_groups_only(for_choice, config)
    experts = for_choice.topk(config.num_experts_per_tok, dim=-1).indices
    weights = scores.gather(1, experts)
    if config.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)  # 1e-20: a zero sum stays finite
    return experts, weights * config.routed_scaling_factor


def _eligible_groups_only(scores: torch.Tensor, config: MoEConfig) -> torch.Tensor:
    """scores with every expert outside each token's topk_group best groups set to -inf."""
    tokens = scores.shape[0]
    grouped = scores.view(tokens, config.n_group, -1)
    group_scores = grouped.topk(config.group_top, dim=-1).values.sum(dim=-1)  # [T, n_group]
    best = group_scores.topk(config.topk_group, dim=-1, sorted=False).indices
    eligible = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~eligible[..., None], float("-inf")).view(tokens, -1)


class Router(nn.Module):
    """The gate: one logit per expert (``weight`` [experts, hidden]) and, where the config
    has one, the score bias that steers the choice (``expert_bias`` [experts], a buffer
    saved in the checkpoint)."""

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        if config.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(config.num_experts))
        else:
            self.expert_bias = None
        self._fp32 = None  # weight_fp32's cache: (the source weight, its address and version, it in float32)

    def forward(self, x: torch.Tensor, groups: torch.Tensor | None = None):
        """x [T, hidden] -> (experts [T, k], weights [T, k] fp32 when router_fp32); groups: route()'s."""
        if self.config.router_fp32:
            logits = nn.functional.linear(x.float(), self.weight_fp32())
        else:
            logits = nn.functional.linear(x, self.weight).float()
        return route(logits, self.config, self.expert_bias, groups)

    def weight_fp32(self) -> torch.Tensor:
        """The weight in float32. LLaDA2's official gate converts it on every forward; a bf16 model
        here converts it once, and again only after the weight changes (new storage or a new version:
        load_state_dict, .to(), an optimiser step): the same numbers, bf16 -> fp32 being exact. A write
        through ``weight.data`` (its own version counter) is not seen: write to the weight under no_grad.
        Used as is: a float32 weight, one being trained (autograd must see the conversion), and an
        inference-mode tensor (it has no version counter to tell a change)."""
        w = self.weight
        if w.dtype == torch.float32 or w.is_inference() or (w.requires_grad and torch.is_grad_enabled()):
            self._fp32 = None  # a copy of an earlier weight (before .float(), say) is not held on for nothing
            return w.float()
        key = (w.data_ptr(), w._version, w.shape, w.device, w.dtype)
        cached = getattr(self, "_fp32", None)  # None also in a Router pickled before the cache existed
        if cached is None or cached[1] != key:
            # the source storage is held so that no other weight can take its address while cached; the
            # copy is made outside inference mode, so that a later forward under autograd may use it
            with torch.inference_mode(False):
                cached = self._fp32 = (w.detach(), key, w.detach().float())
        return cached[2]

    def __getstate__(self):
        return {**super().__getstate__(), "_fp32": None}  # a cache: neither saved nor deep-copied


class MoEFeedForward(nn.Module):
    """Routed experts (plus shared experts) in place of a dense feed-forward layer.

    forward(x [..., hidden]) -> [..., hidden] in x's dtype. The routed outputs are
    weighted and summed in fp32, then cast back (as LLaDA2's official forward does).
    ``experts`` is a StackedExperts (moe_experts.py; an ExpertList once quantized);
    ``kernel`` names how they run (moe_kernels.py, set_moe_kernel)."""

    kernel = AUTO

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.config = config
        self.gate = Router(config)
        self.experts = StackedExperts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = None
        if config.num_shared_experts:
            self.shared_experts = ExpertMLP(
                config.hidden_size, config.moe_intermediate_size * config.num_shared_experts
            )

    def route_tokens(self, flat: torch.Tensor, ctx=None):
        """The gate's (experts, weights) of flat [T, hidden]; ctx (models/layers.Context): where block routing
        reads each position's block (None: consecutive runs of block_size tokens)."""
        groups = None
        if self.config.expert_capacity and ctx is not None:
            groups = context_groups(ctx, self.config.block_size)
        return self.gate(flat, groups)

    def forward(self, x: torch.Tensor, ctx=None) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        experts, weights = self.route_tokens(flat, ctx)
        out = run_experts(self.experts, self.kernel, flat, experts, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape)


def set_moe_kernel(model: nn.Module, kernel: str) -> None:
    """Run every MoE layer of `model` with `kernel` (moe_kernels.py: auto, loop, grouped, sized, padded,
    native); InputError for an unknown one, a stacked-only kernel on quantized experts, or native
    where it cannot run (no compiler, not a CPU, the CPU lacks its instructions)."""
    # MoEFeedForward, and any family's layer that runs routed experts itself (runs_experts: DiffusionGemma's)
    layers = [
        m for m in model.modules() if isinstance(m, MoEFeedForward) or getattr(m, "runs_experts", False)
    ]
    quantized = any(not isinstance(m.experts, StackedExperts) for m in layers)
    check_kernel(kernel, quantized, [m.experts for m in layers])
    for layer in layers:
        layer.kernel = kernel


def expert_parameter_counts(config: MoEConfig) -> tuple[int, int]:
    """(all parameters, parameters active per token) of one MoE layer (the bias buffer excluded)."""
    expert = 3 * config.hidden_size * config.moe_intermediate_size
    router = config.num_experts * config.hidden_size
    shared = expert * config.num_shared_experts
    return (
        router + expert * config.num_experts + shared,
        router + expert * config.num_experts_per_tok + shared,
    )
