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


@functools.lru_cache(maxsize=None)
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
        raise InputError(f"--compile: torch {torch.__version__} cannot compile on this machine "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); run without --compile") from None
    return norm, mlp


def enable_compile(lm) -> None:
    """Swap the compiled kernels into every norm and MLP of `lm`'s model."""
    if lm.device.type == "meta":
        raise InputError("--compile: a model on the meta device has no data to compile for")
    if getattr(lm, "compiled", False):
        return
    norm, mlp = compiled_kernels(lm.device.type)
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
