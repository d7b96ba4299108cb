"""Faster kernels than torchao's for a quantization scheme on one device type: torchao's quantized
weights repacked as each layer is quantized (models/quantize.py applies them). One so far:
int8-dynamic on a CPU through oneDNN's int8 matmul (models/cpu_int8.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Packing:
    """torchao's quantized weights repacked for a faster kernel of one device type, at load."""

    kernel: str  # what runs the matmul, for reports
    available: Callable[[], bool]  # whether this torch can run it
    apply: Callable[[nn.Module], None]  # converts torchao's weights inside a module in place
    linear_bytes: Callable[[int, int, torch.dtype], int]  # bytes of an [out, in] weight once packed
    holds: Callable[[torch.Tensor], bool]  # whether a weight is in this packing


def kernel_of(model: nn.Module, packing: Packing | None) -> str:
    """What runs the quantized matmuls of a loaded model: the packing's kernel, or torchao's."""
    if packing is not None and any(packing.holds(p) for p in model.parameters()):
        return packing.kernel
    return "torchao"


def _cpu_int8():
    from . import cpu_int8  # imports torchao: only once a quantization is asked for

    return cpu_int8


# int8-dynamic on a CPU: oneDNN's int8 matmul (AMX / VNNI) over the weights packed once
ONEDNN_INT8 = Packing(
    "onednn int8 (packed at load)",
    lambda: _cpu_int8().available(),
    lambda module: _cpu_int8().pack_int8_dynamic(module),
    lambda out, inp, dtype: out * inp + out * 4,  # int8 data, a float32 scale per row
    lambda t: isinstance(t, _cpu_int8().OnednnInt8Weight),
)
