"""int8-dynamic on a CPU through oneDNN (AMX / VNNI int8 matmuls), packed once at load.

torchao's ``Int8DynamicActivationInt8WeightConfig`` quantizes the weights (int8, one scale per
output channel) and, per forward, the activations (int8, one scale per token); on a CPU its
matmul is ``torch._int_mm``, which on the 126k-vocabulary head runs at about the speed of
float32 (BENCHMARKS.md, "Quantized CPU forwards against llama.cpp"). This module keeps
torchao's quantized values and swaps the matmul: the int8 weight is reordered once into
oneDNN's blocked layout (``onednn.qlinear_prepack``) and each forward is one
``onednn.qlinear_pointwise`` with int32 accumulation. The accumulation is exact, so a row's
result never depends on the other rows of its batch (batch invariance holds), and the
numbers are torchao's but for the order of the two float scale products.

``pack_int8_dynamic(module)`` converts every torchao int8-dynamic weight inside `module`;
quantize.py calls it on CPUs whose torch has oneDNN (``available()``), except under --compile:
Inductor cannot lower oneDNN's opaque packed weight, so a compiled model keeps torchao's kernel.
The routed experts of an MoE layer, once packed, become ``OnednnInt8Experts``: the loop kernel's
per-expert matmuls, with the per-token work of its three linears done once over all rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchao.utils import TorchAOBaseTensor

from .moe_experts import PROJECTIONS, ExpertList

aten = torch.ops.aten
_EPS = torch.finfo(torch.float32).eps


def available() -> bool:
    """Whether this torch can run the oneDNN int8 linear (built with oneDNN, the op registered)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


class OnednnInt8Weight(TorchAOBaseTensor):
    """An [out, in] int8 weight in oneDNN's packed layout and its float32 scale per output
    channel; F.linear on it quantizes the activation per token and runs oneDNN's int8 matmul."""

    tensor_data_names = ["packed", "scale"]
    tensor_attribute_names = ["shape", "act_dtype"]

    def __new__(cls, packed, scale, shape, act_dtype):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=act_dtype, device=scale.device,
                                                   requires_grad=False)

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, shape, act_dtype: torch.dtype):
        super().__init__()
        self.packed, self.scale, self.act_dtype = packed, scale, act_dtype

    @classmethod
    def from_int8(cls, qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> "OnednnInt8Weight":
        """From an [out, in] int8 weight and its scale per output channel (torchao's Int8Tensor data)."""
        packed = torch.ops.onednn.qlinear_prepack(qdata.contiguous(), None)
        return cls(packed, scale.reshape(-1).float().contiguous(), qdata.shape, dtype)

    def dequantize(self, output_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight in floating point: the kernel applied to the identity (exact: int32 sums of one term)."""
        eye = torch.eye(self.shape[1], dtype=torch.int8, device=self.device)
        return _matmul(eye, self.packed, self.scale, torch.float32).t().to(output_dtype or self.dtype)


def _matmul(x_int8: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype):
    zero_points = torch.zeros(scale.shape[0], dtype=torch.long, device=scale.device)
    return torch.ops.onednn.qlinear_pointwise(x_int8, 1.0, 0, packed, scale, zero_points, None, 1.0, 0,
                                              out_dtype, "none", [], "")


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale [rows, 1]) of a [rows, in] activation: symmetric, one scale per
    row, as torchao's int8-dynamic (scale = max |x| / 127.5 computed in x's dtype, as torchao does,
    then float32; values quantized in float32, rounded and clamped to int8)."""
    scale = (x.abs().amax(dim=1, keepdim=True) / 127.5).float().clamp_min_(_EPS)
    x = x.float()
    return torch.round(x * (1.0 / scale)).clamp_(-128, 127).to(torch.int8), scale


def int8_linear(x: torch.Tensor, weight: OnednnInt8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    out_features = weight.shape[0]
    if rows.shape[0] == 0:
        y = rows.new_zeros(0, out_features)
    else:
        values, scale = quantize_per_token(rows)
        y = _matmul(values, weight.packed, weight.scale, x.dtype).mul_(scale.to(x.dtype))
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out_features)


@OnednnInt8Weight.implements(aten.linear.default)
@OnednnInt8Weight.implements_torch_function(torch.nn.functional.linear)
def _(func, types, args, kwargs):
    return int8_linear(args[0], args[1], args[2] if len(args) > 2 else (kwargs or {}).get("bias"))


class OnednnInt8Experts(ExpertList):
    """Routed experts whose projections are all OnednnInt8Weight, run by the loop kernel
    (models/moe_kernels.py) through ``run_rows``: each expert's three oneDNN matmuls on its own
    rows in turn, as the per-expert loop, while what int8_linear does per call for every row (the
    per-token quantization, shared by gate and up, and the scaling) and the SwiGLU's silu and
    product run once over all the layer's rows. Row by row the same operations as the per-expert
    loop (each row's int32 sums exact, its quantization its own), so the same numbers; the
    per-call overhead of 64 experts x 3 small linears was half their time (BENCHMARKS.md)."""

    def run_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The experts' outputs for `rows` [P, hidden] sorted by expert, counts[e] rows each."""
        runs = [(e, start, start + n) for e, (start, n) in enumerate(zip(_starts(counts), counts)) if n]
        if not runs:  # no row at all (an empty forward)
            return rows.new_zeros(rows.shape[0], self[0].down_proj.weight.shape[0])
        values, scale = quantize_per_token(rows)
        scale = scale.to(rows.dtype)
        gate = self._each(runs, values, "gate_proj", rows.dtype).mul_(scale)
        up = self._each(runs, values, "up_proj", rows.dtype).mul_(scale)
        values, scale = quantize_per_token(F.silu(gate) * up)
        return self._each(runs, values, "down_proj", rows.dtype).mul_(scale.to(rows.dtype))

    def _each(self, runs, values: torch.Tensor, projection: str, dtype: torch.dtype) -> torch.Tensor:
        """Each expert's int8 matmul on its own rows (unscaled by the rows' scales), in row order."""
        parts = []
        for e, start, end in runs:
            weight = getattr(self[e], projection).weight
            parts.append(_matmul(values[start:end], weight.packed, weight.scale, dtype))
        return torch.cat(parts)


def _starts(counts: list[int]) -> list[int]:
    starts, total = [], 0
    for n in counts:
        starts.append(total)
        total += n
    return starts


def pack_int8_dynamic(module: nn.Module) -> None:
    """Replace every torchao int8-dynamic weight (per-row int8, symmetric) inside `module` by its
    oneDNN-packed equivalent; other weights (and any torchao layout this kernel does not compute
    the same way) are left as they are. Routed experts all packed become OnednnInt8Experts."""
    for linear in module.modules():
        w = getattr(linear, "weight", None)
        if isinstance(linear, nn.Linear) and _symmetric_int8_dynamic(w):
            linear.weight = nn.Parameter(OnednnInt8Weight.from_int8(w.qdata, w.scale, w.dtype), requires_grad=False)
    for parent in list(module.modules()):
        experts = getattr(parent, "experts", None)
        if type(experts) is ExpertList and all(isinstance(getattr(mlp, name).weight, OnednnInt8Weight)
                                               for mlp in experts for name in PROJECTIONS):
            parent.experts = OnednnInt8Experts(list(experts))


def _symmetric_int8_dynamic(w) -> bool:
    from torchao.quantization import Int8Tensor, MappingType

    if not isinstance(w, Int8Tensor) or w.act_quant_kwargs is None or w.act_pre_scale is not None:
        return False
    per_row = w.scale.numel() == w.shape[0]
    no_zero = w.zero_point is None or not bool(w.zero_point.any())
    return per_row and no_zero and w.act_quant_kwargs.mapping_type == MappingType.SYMMETRIC
