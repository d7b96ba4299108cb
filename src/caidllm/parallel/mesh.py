"""The tensor-parallel group: its ranks, the one collective the forward needs (a sum over
ranks), the time spent in it, and the checks of ``--tp N`` against a model and a device.

A failed collective (a peer that died closes its connection; a hung one passes the
group's timeout) is a RankFailure naming the rank and the collective, never a hang."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import InputError, RankFailure
from ..models.plan import check_tp_divides

# How long any wait on a peer may last (--tp-timeout): joining, a forward's sum, a control message.
DEFAULT_TIMEOUT_S = 120.0


@dataclass
class TPGroup:
    """The ranks one model is divided among. ``group`` None with size 1: no collective at all."""

    rank: int
    size: int
    group: object = None  # a torch.distributed ProcessGroup (the forward's sums)
    control: object = None  # a gloo ProcessGroup on the host: the engine's inputs (mirror.py)
    collective_s: float = (
        0.0  # seconds spent in the forward's sums (on CUDA: including the wait for the kernels)
    )
    collectives: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks, in place; a RankFailure when a peer is gone."""
        if self.size == 1:
            return x
        started = time.perf_counter()
        try:
            dist.all_reduce(x, group=self.group)
        except Exception as error:  # noqa: BLE001 - gloo / nccl raise RuntimeError and DistBackendError
            raise RankFailure(
                f"tensor-parallel rank {self.rank}/{self.size}: a peer rank failed or hung during a "
                f"forward's all-reduce ({first_line(error)})"
            ) from None
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)  # the time then holds the collective, not just its launch
        self.collective_s += time.perf_counter() - started
        self.collectives += 1
        return x

    def shard(self, total: int) -> slice:
        """This rank's contiguous share of `total` equal parts (the caller checked divisibility)."""
        per = total // self.size
        return slice(self.rank * per, (self.rank + 1) * per)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def backend_for(device: torch.device | str) -> str:
    """nccl for CUDA devices, gloo for CPUs; an InputError for a device neither drives."""
    kind = torch.device(device).type
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise InputError(
                "--tp with --device cuda: no CUDA GPU is available here; use --device cpu (gloo)"
            )
        if not dist.is_nccl_available():
            raise InputError(
                "--tp on CUDA needs torch.distributed's nccl backend, which this torch build lacks"
            )
        return "nccl"
    if kind == "cpu":
        return "gloo"
    raise InputError(
        f"--tp with --device {device}: torch.distributed drives CPUs (gloo) and CUDA GPUs (nccl), "
        f"not {kind!r} devices; use --device cpu or cuda"
    )


# On a CPU every rank is a process: a small machine may run more ranks than cores (slowly), which
# is what checking correctness at tp 4 on a laptop needs.
CPU_RANKS_AT_LEAST = 8


def cpu_cores() -> int:
    """The cores this process may run on (its affinity: a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_ranks(device: torch.device | str) -> int:
    """How many ranks --tp may use here: one per GPU on CUDA; on a CPU, the cores (at least 8)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.device_count()
    return max(cpu_cores(), CPU_RANKS_AT_LEAST)


def check_tp(tp, config, device) -> None:
    """--tp N against the machine and the model's sizes: each a clear InputError naming them."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"--tp must be a positive integer, got {tp!r}")
    if tp == 1:
        return
    backend_for(device)
    have = available_ranks(device)
    if tp > have:
        if torch.device(device).type == "cuda":
            raise InputError(f"--tp {tp} needs {tp} ranks, one GPU each, but this machine has {have} GPUs")
        raise InputError(
            f"--tp {tp} needs {tp} ranks, but this machine has {cpu_cores()} CPU cores: at most "
            f"{have} CPU ranks (the cores, or {CPU_RANKS_AT_LEAST} on a smaller machine)"
        )
    # each rank an equal share of heads, KV heads, widths and experts (as --plan)
    check_tp_divides(tp, config)


def init_group(rank: int, size: int, port: int, device: torch.device, timeout_s: float) -> TPGroup:
    """Join the group of `size` ranks at 127.0.0.1:port (this process's default group) and
    make the host-side control group the engine's inputs travel on. Every rank has announced
    itself before (launch.py), so joining takes a moment: `timeout_s` bounds it as any other wait."""
    backend = backend_for(device)
    wait = timedelta(seconds=timeout_s)
    try:
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size, timeout=wait
        )
        forward = dist.new_group(backend=backend, timeout=wait)
        # The control group's waits are bounded too: rank 0 sends a keep-alive while idle (mirror.py).
        control = dist.new_group(backend="gloo", timeout=wait)
    except Exception as error:  # noqa: BLE001 - the store's and the backends' errors have many types
        raise RankFailure(
            f"tensor-parallel rank {rank}/{size}: the group did not form within {timeout_s:g} s "
            f"({first_line(error)})"
        ) from None
    return TPGroup(rank, size, group=forward, control=control, device=device)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
