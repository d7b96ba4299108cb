"""Counting host-device synchronisations during decoding steps.

On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` makes torch warn at every
synchronising call; the warnings are counted. On a CPU nothing synchronises,
so the counter counts the calls that *would* synchronise on a GPU instead: it
patches, for the duration of the block,

- the tensor -> host reads: ``Tensor.item``, ``tolist``, ``__bool__``,
  ``__int__``, ``__float__``, ``cpu``, ``numpy``, ``nonzero``, ``unique``, and
  ``torch.equal``, ``torch.nonzero``, ``torch.unique``;
- host -> device copies from pageable memory: ``torch.tensor`` /
  ``torch.as_tensor`` with an explicit ``device`` (synchronous on CUDA);

and counts a call of ``models.transfer.to_host`` (the engine's one transfer per
forward group) as one sync, ignoring the calls made inside it and inside
``models.transfer.to_device`` (the asynchronous pinned copy). Host bookkeeping
on Python lists is not counted: it never touches a tensor.
"""

from __future__ import annotations

import functools
import warnings

import torch

from caidllm.models import transfer

TENSOR_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy", "nonzero", "unique")
TORCH_READS = ("equal", "nonzero", "unique")
TORCH_COPIES = ("tensor", "as_tensor")


class SyncCounter:
    """``with SyncCounter(device) as counter: ...``; then ``counter.count``."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.count = 0
        self.sites: list[str] = []  # what was counted (patch mode), for a failing test's message
        self._quiet = 0
        self._undo: list = []

    def __enter__(self):
        if self.cuda:
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            return self
        for name in TENSOR_READS:
            self._patch(torch.Tensor, name, self._counted(getattr(torch.Tensor, name), name))
        for name in TORCH_READS:
            self._patch(torch, name, self._counted(getattr(torch, name), f"torch.{name}"))
        for name in TORCH_COPIES:
            self._patch(torch, name, self._copy_counted(getattr(torch, name), f"torch.{name}"))
        self._patch(transfer, "to_host", self._sanctioned(transfer.to_host, counted=True))
        self._patch(transfer, "to_device", self._sanctioned(transfer.to_device, counted=False))
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self.count += sum("synchroniz" in str(w.message) for w in self._caught)
            self._warnings.__exit__(*exc)
            return
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    # ---- patch mode -----------------------------------------------------------

    def _patch(self, owner, name, replacement):
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def _hit(self, site: str):
        if not self._quiet:
            self.count += 1
            self.sites.append(site)

    def _counted(self, original, site):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            self._hit(site)
            return original(*args, **kwargs)

        return wrapper

    def _copy_counted(self, original, site):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if kwargs.get("device") is not None:
                self._hit(f"{site}(device=...)")
            return original(*args, **kwargs)

        return wrapper

    def _sanctioned(self, original, counted: bool):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if counted:
                self._hit("transfer.to_host")
            self._quiet += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._quiet -= 1

        return wrapper


def syncs_per_step(engine, steps: int) -> tuple[float, int]:
    """Run `steps` engine steps (fewer if the work ends) under a SyncCounter: the host syncs
    per forward group and the number of forward groups run."""
    forwards_before = engine.runner.forwards
    with SyncCounter(engine.lm.device) as counter:
        for _ in range(steps):
            if not engine.has_work:
                break
            engine.step()
    forwards = engine.runner.forwards - forwards_before
    return (counter.count / forwards if forwards else 0.0), forwards
