"""Device and dtype names as the loaders accept them, and a trial that the pair works."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ModelLoadError

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"unknown device {device!r}: {e}") from None


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        raise ModelLoadError(f"unsupported dtype {dtype}; expected bfloat16, float16 or float32")
    name = str(dtype).lower().removeprefix("torch.")
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def check_device_dtype(device: torch.device, dtype: torch.dtype) -> None:
    # A tiny trial of the two kernels the model needs, so an unusable pair
    # fails here with a clear message instead of deep inside the first forward.
    try:
        a = torch.ones(1, 1, 4, 8, device=device, dtype=dtype)
        (a @ a.transpose(-1, -2)).sum().item()
        F.scaled_dot_product_attention(a, a, a).sum().item()
    except Exception as e:  # noqa: BLE001 - any failure means the pair is unusable
        raise ModelLoadError(f"device {device} cannot run dtype {dtype}: {type(e).__name__}: {e}") from None
