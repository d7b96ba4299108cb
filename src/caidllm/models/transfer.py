"""Host <-> device copies on the decoding hot path, without avoidable host syncs.

A plain ``torch.tensor(values, device="cuda")`` copies from pageable memory and
waits for the copy (a host sync); ``to_device`` copies from pinned memory
asynchronously instead. ``to_host`` is the one sanctioned device -> host
transfer of a step (the engine reads each forward group's commits through it):
tools that count host syncs (bench/syncs.py) count a call of it as one sync and
ignore what happens inside it.
"""

from __future__ import annotations

import torch


def to_device(values, device, dtype=torch.long) -> torch.Tensor:
    """A small tensor of host values (a list of ints) on `device`, copied without a host sync."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_host(tensor: torch.Tensor) -> list:
    """`tensor` as nested Python lists: one device -> host transfer (one sync on a GPU)."""
    return tensor.cpu().tolist()
