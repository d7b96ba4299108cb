"""Training a mixture-of-experts model (tiny-moe, LLaDA2 layout): the architecture of the
starting checkpoint, the expert loads, and LLaDA2's auxiliary-loss-free load balancing.

LLaDA2 (like DeepSeek-V3) keeps its experts evenly loaded without a balancing loss: each
router has a score bias, added to the sigmoid scores for the choice only, and after every
optimiser step each expert's bias moves by ``rate`` towards balance (up when the expert got
fewer tokens than the mean in that step, down when it got more).
"""

from __future__ import annotations

import json

import torch

from caidllm.models.loading import resolve_folder
from caidllm.models.moe import Router


def initial_config(init_from: str, default: dict) -> dict:
    """The config.json a run starting from `init_from` trains: `default` (the recipe's LLaDA
    layout) for a LLaDA-layout start, else the start's own (e.g. the upcycled LLaDA2 model)."""
    folder, _ = resolve_folder(init_from)
    raw = json.loads((folder / "config.json").read_text())
    if raw.get("model_type") == "llada":
        return default
    return dict(raw, torch_dtype="float32")


class ExpertCounter:
    """Tokens routed to each expert, per MoE layer, while attached (forward hooks on the routers)."""

    def __init__(self, model: torch.nn.Module, training_only: bool = False):
        self.routers = [m for m in model.modules() if isinstance(m, Router)]
        self.counts = [torch.zeros(r.config.num_experts, dtype=torch.long) for r in self.routers]
        self.training_only = training_only
        self.hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def _hook(self, index: int):
        def count(module, args, output):
            if self.training_only and not module.training:
                return
            experts = output[0].reshape(-1).cpu()
            self.counts[index] += torch.bincount(experts, minlength=len(self.counts[index]))

        return count

    def shares(self) -> list[list[float]]:
        """Per MoE layer, each expert's share of the routed (token, choice) pairs."""
        return [(c.double() / max(1, int(c.sum()))).tolist() for c in self.counts]

    def reset(self) -> None:
        for c in self.counts:
            c.zero_()

    def detach(self) -> None:
        for hook in self.hooks:
            hook.remove()


class ExpertBalancer(ExpertCounter):
    """Moves each router's expert_bias towards balanced loads after each step (module docstring)."""

    def __init__(self, model: torch.nn.Module, rate: float = 1e-3):
        super().__init__(model, training_only=True)
        self.rate = rate

    @torch.no_grad()
    def update(self) -> None:
        for router, counts in zip(self.routers, self.counts):
            if router.expert_bias is not None and int(counts.sum()):
                load = counts.float()
                router.expert_bias += self.rate * torch.sign(load.mean() - load).to(router.expert_bias)
        self.reset()
