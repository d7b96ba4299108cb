"""``compile=True`` (``caidllm.load(..., compile=True)``, ``--compile``): the dense,
shape-regular parts of each layer go through torch.compile.

What is compiled: the RMSNorm and the SwiGLU MLP (fused elementwise work around
the projections), as free functions of (activations, weights), so one compiled
graph serves every layer and every instance. Attention, the cache reads and
writes and early skipping stay eager: they are Python control flow over the
engine's per-row layout and would recompile as the batch changes.

Shapes are bucketed by marking the token dimensions dynamic (``dynamic=True``):
a decode compiles once for its first shape and once more symbolically, then
never again as the canvas, block and batch sizes move. ``recompiles()`` reads
torch's own count. Off by default; where torch cannot compile (no Dynamo or no
working backend, e.g. no C++ compiler for the CPU backend) it is a clear
InputError.
"""

from __future__ import annotations

import functools

import torch

from ..errors import InputError
from .layers import RMSNorm, rms_norm, swiglu_weights


@functools.cache
def compiled_kernels(device: str = "cpu"):
    """(rms_norm, swiglu) compiled once per process and device type; InputError if torch
    cannot compile for it here."""
    try:
        norm = torch.compile(rms_norm, dynamic=True)
        mlp = torch.compile(swiglu_weights, dynamic=True)
        x = torch.ones(2, 3, 8, device=device)
        norm(x, torch.ones(8, device=device), 1e-5)  # a trial: a broken tool chain fails here, not mid-decode
    except Exception as e:  # noqa: BLE001 - Dynamo / Inductor raise many types
        compiled_kernels.cache_clear()
        raise InputError(
            f"--compile: torch {torch.__version__} cannot compile on this machine "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); run without --compile"
        ) from None
    return norm, mlp


@functools.cache
def check_quantized_compile(quantization: str, device: str, dtype: torch.dtype) -> None:
    """A trial: the compiled MLP kernel over weights quantized with `quantization` (checked for
    the device already), so a pair torch cannot compile fails before the model loads."""
    from torch import nn

    from .quantize import QUANTIZATIONS, quantize_module

    _, mlp = compiled_kernels(device)
    try:
        with torch.device(device):
            layers = nn.ModuleList(nn.Linear(64, 64, bias=False) for _ in range(3)).to(dtype)
        quantize_module(layers, QUANTIZATIONS[quantization], torch.device(device), pack=False)
        _no_autograd_cache()
        mlp(
            torch.ones(2, 3, 64, device=device, dtype=dtype), *(layer.weight for layer in layers)
        ).sum().item()
    except Exception as e:  # noqa: BLE001 - Dynamo / Inductor / torchao raise many types
        check_quantized_compile.cache_clear()
        raise InputError(
            f"--compile with --quantize {quantization}: torch {torch.__version__} cannot compile "
            f"torchao's {quantization} layers on {device} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); drop one of the two"
        ) from None


def _check_not_packed(lm) -> None:
    """Weights repacked at load for a device's kernel (models/packing.py) cannot be compiled:
    only a load with compile=True keeps torchao's tensors."""
    from .packing import ONEDNN_INT8, kernel_of

    if kernel_of(lm.model, ONEDNN_INT8) != "torchao":
        raise InputError(
            f"compile=True on a model whose --quantize {lm.quantization} weights were packed at load "
            f"for {ONEDNN_INT8.kernel}, which torch.compile cannot lower: load it with "
            "caidllm.load(..., compile=True) (torchao's kernel) or generate without compile"
        )


def _no_autograd_cache() -> None:
    # AOTAutograd's cache cannot hash torchao's tensors and logs a long warning per graph; inference needs no
    # cache.
    import torch._functorch.config as functorch_config

    functorch_config.enable_autograd_cache = False


def enable_compile(lm) -> None:
    """Swap the compiled kernels into every norm and MLP of `lm`'s model."""
    if lm.device.type == "meta":
        raise InputError("--compile: a model on the meta device has no data to compile for")
    if getattr(lm, "compiled", False):
        return
    norm, mlp = compiled_kernels(lm.device.type)
    if lm.quantization is not None:
        check_quantized_compile(lm.quantization, lm.device.type, lm.dtype)
        _check_not_packed(lm)
    for module in lm.model.modules():
        if isinstance(module, RMSNorm):
            module.kernel = norm
        elif hasattr(type(module), "mlp_kernel"):
            module.mlp_kernel = mlp
    lm.compiled = True


def recompiles() -> int:
    """Graphs torch.compile has built in this process so far (each shape bucket is one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
