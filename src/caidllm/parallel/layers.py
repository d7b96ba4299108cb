"""The sharded pieces of a layer: a row-parallel Linear, column and row slices of a Linear's
weights, and a SwiGLU divided over its intermediate width."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .mesh import TPGroup


class RowParallelLinear(nn.Module):
    """A Linear whose input features are divided among the ranks: each computes its partial
    product, the group sums them, then the bias (held by every rank) is added once."""

    def __init__(self, linear: nn.Linear, part: slice, tp: TPGroup):
        super().__init__()
        self.weight = sliced(linear.weight, 1, part)
        self.bias = linear.bias
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


def sliced(param: torch.Tensor, dim: int, index) -> nn.Parameter:
    """A parameter of param's part `index` along `dim` (0: rows, 1: columns). It remembers the
    part (``tp_part``), so a model sharded on the meta device reads just that part from its
    checkpoint (parallel/loading.py)."""
    part = param.data[index] if dim == 0 else param.data[:, index]
    out = nn.Parameter(part.clone(), requires_grad=False)
    out.tp_part = (dim, index)
    return out


def keep_rows(linear: nn.Linear, rows: torch.Tensor | slice) -> None:
    """Keep only output features `rows` of a Linear (column sharding), its bias's with them."""
    linear.weight = sliced(linear.weight, 0, rows)
    if linear.bias is not None:
        linear.bias = sliced(linear.bias, 0, rows)
    linear.out_features = linear.weight.shape[0]


def keep_columns(linear: nn.Linear, columns: slice) -> None:
    """Keep only input features `columns` of a bias-free Linear (row sharding; the caller sums)."""
    linear.weight = sliced(linear.weight, 1, columns)
    linear.in_features = linear.weight.shape[1]


def head_rows(tp: TPGroup, heads: int, head_dim: int) -> slice:
    share = tp.shard(heads)
    return slice(share.start * head_dim, share.stop * head_dim)


def summed_after(kernel, tp: TPGroup):
    """The SwiGLU kernel of a row-sharded down projection: its partial output summed over the ranks."""

    def kernel_then_sum(x, gate, up, down):
        return tp.all_reduce(kernel(x, gate, up, down))

    return kernel_then_sum


def shard_swiglu(module: nn.Module, names: tuple[str, str, str], tp: TPGroup, reduce: bool = True) -> None:
    """gate and up column-sharded, down row-sharded over the intermediate width; `reduce`: the
    module's kernel sums over the ranks (False: its caller sums, the shared expert)."""
    gate, up, down = (getattr(module, name) for name in names)
    part = tp.shard(gate.out_features)
    keep_rows(gate, part)
    keep_rows(up, part)
    keep_columns(down, part)
    if reduce:
        module.mlp_kernel = summed_after(module.mlp_kernel, tp)
