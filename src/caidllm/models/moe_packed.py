"""Routed experts prepacked for oneDNN on a CPU: each expert's three projections reordered once
into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, as Inductor's weight
freezing does) and run by oneDNN's linear with SiLU and the up projection's product fused into
its epilogues (moe_kernels.py's ``packed`` kernel; the AMX bf16 path on CPUs that have it).

The packed weights replace the stacks (``PackedExperts(stacked)``; one copy of the experts in
memory). They are opaque tensors (no storage: they neither pickle nor deepcopy), so what leaves
the module is always the dense form: state_dict() writes the official per-expert names (dense
copies), pickling and deepcopy carry the dense stacks and pack again, ``stacks()`` gives them,
and ``.to(...)`` repacks (a CPU in float32 or bfloat16 only). Inference only: oneDNN's linear has
no autograd formula, so a forward that needs gradients is refused.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError
from .moe_experts import PROJECTIONS, StackedExperts

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def _linear():
    return torch.ops.mkldnn._linear_pointwise


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether this torch can pack and run `dtype` experts through oneDNN on this CPU."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def packable(experts) -> bool:
    """Whether these experts are stacked full-precision weights that oneDNN can pack here."""
    if not isinstance(experts, StackedExperts):
        return False
    weight = experts.gate_proj
    return weight.device.type == "cpu" and weight.dtype in PACKABLE_DTYPES and onednn_packs(weight.dtype)


class PackedExperts(nn.Module):
    """num_experts SwiGLU experts, each projection of each expert one oneDNN-packed weight
    (parameters ``{projection}_{e}``, frozen). Built from a StackedExperts, whose stacks it replaces."""

    def __init__(self, stacked: StackedExperts):
        super().__init__()
        self.num_experts = stacked.num_experts
        self._install({name: getattr(stacked, name).detach() for name in PROJECTIONS})

    @torch.no_grad()
    def _install(self, stacks: dict[str, torch.Tensor]) -> None:
        weight = stacks["gate_proj"]
        if weight.device.type != "cpu" or not onednn_packs(weight.dtype):
            raise InputError(f"packed experts run on a CPU in float32 or bfloat16 through oneDNN; these are "
                             f"{weight.dtype} on {weight.device.type}: use moe_kernel 'grouped' or 'loop'")
        self.shapes = {name: tuple(stack.shape) for name, stack in stacks.items()}
        for name, stack in stacks.items():
            for e in range(self.num_experts):
                packed = torch.ops.mkldnn._reorder_linear_weight(stack[e].contiguous())
                self._parameters[f"{name}_{e}"] = nn.Parameter(packed, requires_grad=False)
        self._by_expert = [tuple(self._parameters[f"{name}_{e}"] for name in PROJECTIONS)
                           for e in range(self.num_experts)]

    @property
    def dtype(self) -> torch.dtype:
        return self._by_expert[0][0].dtype

    def stacks(self) -> dict[str, torch.Tensor]:
        """The dense [experts, out, in] stack of each projection (new tensors)."""
        return {name: torch.stack([self._parameters[f"{name}_{e}"].to_dense() for e in range(self.num_experts)])
                for name in PROJECTIONS}

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's SwiGLU of x [n, hidden]: silu(gate x) * (up x) in two oneDNN calls (fused
        epilogues), then down."""
        if torch.is_grad_enabled() and x.requires_grad:
            raise InputError("packed experts run inference only (oneDNN's linear has no gradient): "
                             "set_moe_kernel(model, 'grouped') to train")
        gate, up, down = self._by_expert[e]
        linear = _linear()
        hidden = linear(x, gate, None, "swish", [], "")
        hidden = linear.binary(x, hidden, up, None, "mul")
        return linear(hidden, down, None, "none", [], "")

    def unpacked(self) -> StackedExperts:
        """A StackedExperts holding these experts' dense weights."""
        stacks = self.stacks()
        inter, hidden = stacks["gate_proj"].shape[1:]
        with torch.device("meta"):
            stacked = StackedExperts(self.num_experts, hidden, inter)
        for name, stack in stacks.items():
            setattr(stacked, name, nn.Parameter(stack, requires_grad=False))
        return stacked

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, stack in self.stacks().items():
            for e in range(self.num_experts):
                destination[f"{prefix}{e}.{name}.weight"] = stack[e]

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Through a dense StackedExperts (its names and checks), then packed again."""
        stacked = self.unpacked()
        stacked._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        self._install({name: getattr(stacked, name).detach() for name in PROJECTIONS})

    def _apply(self, fn, recurse=True):
        self._install({name: fn(stack) for name, stack in self.stacks().items()})
        return self

    def __getstate__(self):
        # Opaque oneDNN tensors have no storage to pickle or deepcopy: the dense stacks travel instead.
        state = self.__dict__.copy()
        state["_parameters"], state["_by_expert"], state["_dense"] = {}, None, self.stacks()
        return state

    def __setstate__(self, state):
        dense = state.pop("_dense")
        super().__setstate__(state)
        self._install(dense)


def replace_experts(model: nn.Module, convert) -> None:
    """Replace each MoE layer's experts inside `model` by convert(experts) (itself when unchanged)."""
    for parent in list(model.modules()):
        experts = getattr(parent, "experts", None)
        if isinstance(experts, (StackedExperts, PackedExperts)):
            converted = convert(experts)
            if converted is not experts:
                parent.experts = converted
