"""The routed experts of a mixture-of-experts layer, their weights stacked: one tensor per
projection over all experts, ``gate_proj`` and ``up_proj`` [experts, intermediate, hidden],
``down_proj`` [experts, hidden, intermediate] (each expert's slice is its nn.Linear weight,
[out, in]), so a grouped kernel (moe_kernels.py) runs every expert in one call.

The checkpoints store one tensor per expert (``experts.{e}.{gate,up,down}_proj.weight``):
state_dict() writes those names (views of the stacks) and load_state_dict() reads them, so
loading, saving (train/) and checking a checkpoint see the official layout. The loader may
hand the whole stack instead (``experts.gate_proj``, ExpertStacks: no second copy).

A quantized model runs its experts as a list of per-expert SwiGLUs (``unstack_experts``):
torchao quantizes nn.Linear layers, not stacked 3-d weights (int8-dynamic on a CPU: a list
that runs its rows itself, cpu_int8.OnednnInt8Experts).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from .layers import swiglu, swiglu_weights

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# A per-expert checkpoint tensor: (experts prefix, expert index, projection).
_EXPERT_TENSOR = re.compile(r"^(.*experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class Projection(nn.Linear):
    """A bias-free Linear left uninitialised: its weights are always loaded or drawn afterwards
    (loading.py, random_init.py)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def reset_parameters(self) -> None:
        pass


class ExpertMLP(nn.Module):
    """One SwiGLU expert: down(silu(gate(x)) * up(x)), no biases."""

    mlp_kernel = staticmethod(swiglu_weights)

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = Projection(hidden_size, intermediate_size)
        self.up_proj = Projection(hidden_size, intermediate_size)
        self.down_proj = Projection(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_proj, self.up_proj, self.down_proj, self.mlp_kernel)


class StackedExperts(nn.Module):
    """num_experts SwiGLU experts, each projection's weights one [experts, out, in] tensor
    (left uninitialised: loaded or drawn afterwards). ``activation`` is the gate's (silu; a
    family with another gated activation, DiffusionGemma's tanh GELU, subclasses it)."""

    activation = staticmethod(F.silu)

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's SwiGLU of x [n, hidden] (the loop kernel's step)."""
        return F.linear(
            self.activation(F.linear(x, self.gate_proj[e])) * F.linear(x, self.up_proj[e]), self.down_proj[e]
        )

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name in PROJECTIONS:
            stacked = getattr(self, name)
            for e in range(self.num_experts):
                destination[f"{prefix}{e}.{name}.weight"] = stacked[e] if keep_vars else stacked[e].detach()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name in PROJECTIONS:
            current = getattr(self, name)
            whole = state_dict.get(prefix + name)
            if whole is not None:
                if tuple(whole.shape) != tuple(current.shape):
                    error_msgs.append(
                        f"size mismatch for {prefix}{name}: copying a param with shape "
                        f"{list(whole.shape)}, the shape in current model is {list(current.shape)}."
                    )
                    continue
            else:
                keys = [f"{prefix}{e}.{name}.weight" for e in range(self.num_experts)]
                absent = [k for k in keys if k not in state_dict]
                if absent:
                    missing_keys.extend(absent)
                    continue
                wrong = [k for k in keys if tuple(state_dict[k].shape) != tuple(current.shape[1:])]
                if wrong:
                    error_msgs.append(
                        f"size mismatch for {wrong[0]}: copying a param with shape "
                        f"{list(state_dict[wrong[0]].shape)}, the shape in current model is "
                        f"{list(current.shape[1:])}."
                    )
                    continue
                whole = [state_dict[k] for k in keys]
            self._set(name, current, whole, assign)
        if strict:
            unexpected_keys.extend(
                k for k in state_dict if k.startswith(prefix) and not self._knows(k[len(prefix) :])
            )

    @torch.no_grad()
    def _set(self, name: str, current: torch.Tensor, whole, assign: bool) -> None:
        if assign or current.is_meta:
            stacked = whole if isinstance(whole, torch.Tensor) else torch.stack(whole)
            setattr(self, name, nn.Parameter(stacked, requires_grad=current.requires_grad))
        elif isinstance(whole, torch.Tensor):
            current.copy_(whole)
        else:
            for e, t in enumerate(whole):
                current[e].copy_(t)

    def _knows(self, key: str) -> bool:
        if key in PROJECTIONS:
            return True
        index, _, rest = key.partition(".")
        return (
            index.isdigit() and int(index) < self.num_experts and rest in {f"{p}.weight" for p in PROJECTIONS}
        )


class ExpertList(nn.ModuleList):
    """The experts one module each (ExpertMLP): the form a quantized model runs (loop kernel)."""

    @property
    def num_experts(self) -> int:
        return len(self)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self[e](x)


@torch.no_grad()
def unstack_experts(module: nn.Module) -> None:
    """Replace every StackedExperts inside `module` by an ExpertList whose Linear weights are
    views of the stacks (no copy), for torchao to quantize one expert at a time."""
    for parent in list(module.modules()):
        stacked = getattr(parent, "experts", None)
        if not isinstance(stacked, StackedExperts):
            continue
        inter, hidden = stacked.gate_proj.shape[1:]
        experts = ExpertList()
        for e in range(stacked.num_experts):
            with torch.device("meta"):
                mlp = ExpertMLP(hidden, inter)
            for name in PROJECTIONS:
                getattr(mlp, name).weight = nn.Parameter(getattr(stacked, name)[e], requires_grad=False)
            experts.append(mlp)
        parent.experts = experts


class ExpertStacks:
    """For the loader: per-expert checkpoint tensors copied straight into their stacks as they
    are read (one copy of the experts in memory, never the per-expert tensors and the stack)."""

    def __init__(self, expected: dict[str, tuple]):
        self.shapes = expected  # every state_dict name of the module -> shape
        self.stacks: dict[str, torch.Tensor] = {}

    def take(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy `tensor` into its stack if it is one expert's projection; False otherwise."""
        match = _EXPERT_TENSOR.match(name)
        if match is None:
            return False
        prefix, e, projection = match.groups()
        key = prefix.removesuffix(".") + "." + projection
        if key not in self.stacks:
            experts = sum(
                1 for n in self.shapes if n.startswith(prefix) and n.endswith(f".{projection}.weight")
            )
            self.stacks[key] = torch.empty((experts, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        self.stacks[key][int(e)].copy_(tensor)
        return True

    def drain(self) -> dict[str, torch.Tensor]:
        """The stacks filled so far (state_dict names ``...experts.gate_proj``), forgotten here."""
        stacks, self.stacks = self.stacks, {}
        return stacks
