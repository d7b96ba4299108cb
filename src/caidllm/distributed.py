"""This process's place among the processes of a torchrun / accelerate launch.

Both launchers set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
`World.from_env()` reads them (a plain `python` run is a world of one) and
`init()` joins the process group: NCCL when each rank has its own GPU
(cuda:LOCAL_RANK), gloo on CPU. Only Python objects travel between ranks
(gather / all_gather of pickled results); every rank computes on its own.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from caidllm.errors import InputError


@dataclass
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, env=None) -> World:
        env = os.environ if env is None else env
        try:
            rank, size, local = (
                int(env.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0))
            )
        except ValueError:
            raise InputError(
                "RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them)"
            ) from None
        if size < 1 or not 0 <= rank < size:
            raise InputError(f"RANK={rank} is not within WORLD_SIZE={size}")
        return cls(rank, size, local)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: str | None) -> str | None:
        """The device of this rank: with several ranks and CUDA, cuda:LOCAL_RANK (one GPU per rank)."""
        if not self.distributed:
            return requested
        text = "" if requested is None else str(requested)
        if text in ("", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        if text.startswith("cuda:"):
            raise InputError(
                f"--device {text} pins one GPU, but under torchrun each rank takes cuda:LOCAL_RANK; "
                "pass --device cuda (or nothing)"
            )
        return text or "cpu"

    def init(self, device: str | None) -> World:
        """Join the process group (once per process); a no-op for a world of one."""
        if not self.distributed or torch.distributed.is_initialized():
            return self
        cuda = device is not None and str(device).startswith("cuda")
        if cuda:
            torch.cuda.set_device(torch.device(device))
        torch.distributed.init_process_group(
            "nccl" if cuda else "gloo", rank=self.rank, world_size=self.world_size
        )
        return self

    def shard(self, n: int) -> list[int]:
        """This rank's indices of n items: every world_size-th, from its rank (as lm-eval splits its docs)."""
        return list(range(self.rank, n, self.world_size))

    def all_gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, obj)
        return gathered

    def gather(self, obj, dst: int = 0) -> list | None:
        """Every rank's `obj` in rank order on `dst`; None elsewhere."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.world_size if self.rank == dst else None
        torch.distributed.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def close(self) -> None:
        if self.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class RankFailed(RuntimeError):
    """Another rank failed: its error, re-raised on every rank so none reports a subset."""


def all_succeed(world: World, error: BaseException | None) -> None:
    """A collective check: raise on every rank if any rank had an error (InputError kept as such)."""
    mine = (
        None
        if error is None
        else (world.rank, type(error).__name__, str(error), isinstance(error, InputError))
    )
    failures = [f for f in world.all_gather(mine) if f is not None]
    if error is not None:
        raise error
    if failures:
        rank, name, message, bad_input = failures[0]
        raise (InputError if bad_input else RankFailed)(f"rank {rank} failed: {name}: {message}")


@contextmanager
def together(world: World):
    """Run a block on every rank; if it fails on any, it fails on all with that rank's error."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - re-raised on this rank, reported to the others
        all_succeed(world, error)
        raise
    all_succeed(world, None)
