"""``--tp N``: a command spawns its own ranks. The process the user started is rank 0 (it
prints, serves, owns the engines); it starts ranks 1 .. N-1 as child processes (spawned,
not forked), which load the same model, keep their share of it and follow rank 0's steps
(mirror.follow). On CUDA rank r drives cuda:r (nccl), on a CPU every rank runs on the host
(gloo); all meet at 127.0.0.1 on a free port.

Failure is bounded: a rank that raises reports its one-line error to rank 0 and exits; a
rank that dies closes its connections, so rank 0's next collective fails at once (the
group's timeout bounds a rank that hangs), and rank 0 raises a RankFailure naming the rank.
A watchdog thread on rank 0 ends the process (exit status 2, one line) if a rank has died and
rank 0 has not stopped on its own within a grace period; each rank leaves when rank 0 goes.
"""

from __future__ import annotations

import copy
import os
import queue
import sys
import threading
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..distributed import World
from ..errors import InputError, RankFailure
from ..options import load_model
from .mesh import DEFAULT_TIMEOUT_S, check_tp, free_port, init_group, ready
from .mirror import Mirror, fail, follow, injected_fault
from .loading import ShardedLoad
from .sharding import shard_model

GRACE_S = 10.0  # how long rank 0 may take to stop on its own after a rank died
SERVER_GRACE_S = 60.0  # a server's: it drains first (--shutdown-grace)


def model_config(name: str):
    """The ModelConfig of a model name without loading its weights (the --tp checks)."""
    from ..models.families import load_config
    from ..models.loading import load, resolve_folder
    from ..models.random_init import is_random_name

    if is_random_name(name):
        return load(name, device="meta").config
    return load_config(resolve_folder(name)[0] / "config.json")


def rank_device(device: str | None, rank: int) -> torch.device:
    """Rank r's device: cuda:r when the command runs on CUDA (one GPU per rank), else the CPU."""
    from ..models.device import resolve_device

    resolved = resolve_device(device)
    if resolved.type == "cuda":
        return torch.device("cuda", rank)
    return resolved


def _rank_args(args, rank: int):
    mine = copy.copy(args)
    mine.device = str(rank_device(args.device, rank))
    return mine


def sharded_model(args, group):
    """This rank's share of the model that `args` names: a checkpoint folder's is read part by
    part (parallel/loading.py: no rank holds the whole model), a random model's drawn whole first."""
    lm = shard_model(load_model(args, shard=ShardedLoad(group), quiet=group.rank != 0), group)
    ready(group)
    return lm


def worker_main(args, rank: int, size: int, port: int, timeout_s: float, errors) -> None:
    """Ranks 1 .. N-1: join, load and shard, follow rank 0 until it stops or goes."""
    parent = os.getppid()
    threading.Thread(target=_leave_with_parent, args=(parent,), daemon=True).start()
    args = _rank_args(args, rank)
    try:
        fault = injected_fault(rank)
        if fault is not None and fault[0] == 0:  # step 0: before the rank joins the group
            fail(fault[1])
        group = init_group(rank, size, port, torch.device(args.device), timeout_s)
        lm = sharded_model(args, group)
        follow(lm, group)
        dist.destroy_process_group()
    except RankFailure:
        os._exit(3)  # rank 0 went first: it reports
    except BaseException as error:  # noqa: BLE001 - whatever it was, rank 0 must hear it
        text = str(error).strip().splitlines()
        errors.put((rank, f"{type(error).__name__}: {text[0] if text else ''}"))
        errors.close()
        errors.join_thread()  # the report reaches the pipe before the process ends
        os._exit(2)


def _leave_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(3)


class Ranks:
    """Rank 0's handle on ranks 1 .. N-1: their processes, their reported errors, a watchdog."""

    def __init__(self, args, size: int, timeout_s: float):
        context = mp.get_context("spawn")
        self.port = free_port()
        self.errors = context.Queue()
        self.processes = [context.Process(target=worker_main, args=(args, rank, size, self.port, timeout_s,
                                                                     self.errors), daemon=True)
                          for rank in range(1, size)]
        self.finished = False
        self.reported = None
        self.on_failure = None  # called once when a rank dies (a server drains and stops)
        for process in self.processes:
            process.start()
        threading.Thread(target=self._watch, daemon=True).start()

    def failure(self) -> str | None:
        """The first error a rank reported, or which rank died, if any."""
        if self.reported is not None:
            return self.reported
        try:
            rank, text = self.errors.get(timeout=0.5)
            self.reported = f"tensor-parallel rank {rank} failed: {text}"
            return self.reported
        except queue.Empty:
            pass
        for rank, process in enumerate(self.processes, start=1):
            if process.exitcode not in (None, 0):
                return f"tensor-parallel rank {rank} died (exit status {process.exitcode})"
        return None

    def raise_failure(self) -> None:
        if any(p.exitcode not in (None, 0) for p in self.processes):
            raise RankFailure(self.failure())

    def _watch(self) -> None:
        while not self.finished:
            time.sleep(0.2)
            if any(p.exitcode not in (None, 0) for p in self.processes):
                if self.on_failure is not None:
                    self.on_failure()
                time.sleep(GRACE_S if self.on_failure is None else SERVER_GRACE_S)
                if not self.finished:
                    print(f"caidllm: error: {self.failure()}; stopping every rank", file=sys.stderr, flush=True)
                    self.stop()
                    os._exit(2)

    def stop(self, wait_s: float = 5.0) -> None:
        self.finished = True
        deadline = time.monotonic() + wait_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join(1.0)


@contextmanager
def parallel_model(args, tp: int, timeout_s: float | None = None):
    """Rank 0's sharded model over `tp` ranks spawned for it (tp 1: the whole model, no ranks);
    on leaving, the other ranks are told to stop and joined (killed past a few seconds)."""
    if tp == 1:
        yield load_model(args)
        return
    if getattr(args, "compile", False) or getattr(args, "quantize", None):
        raise InputError("--tp does not take --compile or --quantize yet (their kernels would replace the sharded "
                         "layers' sums); run --tp without them")
    if World.from_env().distributed:
        raise InputError("--tp spawns its own ranks; run it without torchrun (replicas of a sharded model "
                         "are not supported)")
    device = rank_device(args.device, 0)
    check_tp(tp, model_config(args.model), device)
    if timeout_s is None:
        timeout_s = getattr(args, "tp_timeout", DEFAULT_TIMEOUT_S)
    if not timeout_s > 0:
        raise InputError(f"--tp-timeout must be a positive number of seconds, got {timeout_s!r}")
    ranks = Ranks(args, tp, timeout_s)
    clean = False
    try:
        group = init_group(0, tp, ranks.port, device, timeout_s)
        lm = sharded_model(_rank_args(args, 0), group)
        lm.mirror, lm.tp_ranks = Mirror(group), ranks
        yield lm
        lm.mirror.stop()
        clean = True
    except RankFailure as error:
        raise RankFailure(ranks.failure() or str(error)) from None
    finally:
        ranks.stop(wait_s=10.0 if clean else 0.0)  # after a failure nothing is left for them to do
        if dist.is_initialized():
            dist.destroy_process_group()
