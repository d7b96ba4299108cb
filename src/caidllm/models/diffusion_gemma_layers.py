"""DiffusionGemma's building blocks (models/diffusion_gemma.py): the float32 RMSNorm (with and without a
weight), the GELU-tanh gated MLP, the routed experts on caidllm's MoE kernels (the checkpoint's fused gate/up
layout), the router, and Gemma's rotate-half RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .moe_experts import StackedExperts


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class DGNorm(nn.Module):
    """RMSNorm in float32 (x * (mean(x^2) + eps)^-1/2, times the weight where it has one)."""

    def __init__(self, dim: int, eps: float, scaled: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scaled else None

    def draw_random(self, generator: torch.Generator) -> None:  # random_init.py: N(1, 0.1^2) as other norms
        if self.weight is not None:
            with torch.no_grad():
                self.weight.normal_(1.0, 0.1, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            h = h * self.weight.float()
        return h.type_as(x)


class GatedMLP(nn.Module):
    def __init__(self, d: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class DGExperts(StackedExperts):
    """The routed experts, GELU-tanh gated, run by caidllm's MoE kernels; the checkpoint stores gate
    and up fused (``gate_up_proj`` [experts, 2 * inner, hidden], gate first) and ``down_proj``."""

    activation = staticmethod(gelu_tanh)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        fused = torch.cat([self.gate_proj, self.up_proj], dim=1)
        destination[prefix + "gate_up_proj"] = fused if keep_vars else fused.detach()
        destination[prefix + "down_proj"] = self.down_proj if keep_vars else self.down_proj.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        fused = state_dict.get(prefix + "gate_up_proj")
        if fused is None:
            missing.append(prefix + "gate_up_proj")
            return
        gate, up = fused.chunk(2, dim=1)
        split = {prefix + "gate_proj": gate, prefix + "up_proj": up}
        if prefix + "down_proj" in state_dict:
            split[prefix + "down_proj"] = state_dict[prefix + "down_proj"]
        super()._load_from_state_dict(split, prefix, local_metadata, False, missing, [], errors)


class Router(nn.Module):
    """RMS-normed (no weight) input times ``scale`` / sqrt(hidden), one logit per expert, softmax in fp32,
    top-k, renormalised, times the chosen experts' ``per_expert_scale``."""

    is_router = True  # plan.py: replicated on every rank, as the other families' gates

    def __init__(self, d: int, experts: int, top_k: int, eps: float):
        super().__init__()
        self.norm, self.top_k, self.root = DGNorm(d, eps, scaled=False), top_k, d**-0.5
        self.proj = nn.Linear(d, experts, bias=False)
        self.scale = nn.Parameter(torch.ones(d))
        self.per_expert_scale = nn.Parameter(torch.ones(experts))

    @torch.no_grad()
    def draw_random(self, generator: torch.Generator) -> None:
        self.scale.normal_(1.0, 0.1, generator=generator)
        self.per_expert_scale.normal_(1.0, 0.1, generator=generator)

    def forward(self, x: torch.Tensor):
        probs = self.proj(self.norm(x) * self.scale * self.root).softmax(dim=-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return chosen, weights * self.per_expert_scale[chosen]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, n, heads, hd] rotated by cos / sin [B, n, hd] (halves paired, as Gemma's rotate_half)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None] + turned * sin[:, :, None]
