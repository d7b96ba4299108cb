"""``--tp N``: a command spawns its own ranks. The process the user started is rank 0 (it
prints, serves, owns the engines); it starts ranks 1 .. N-1 as child processes (spawned,
not forked), which load the same model, keep their share of it and follow rank 0's steps
(mirror.follow). On CUDA rank r drives cuda:r (nccl), on a CPU every rank runs on the host
(gloo); all meet at 127.0.0.1 on a free port.

Failure is bounded in every phase (watchdog.py says how): start-up (the ranks announce themselves
on a shared board, then join within ``--tp-timeout``), loading, idle, decoding and stopping. A
rank that raises sends its one-line error on its pipe and exits; rank 0's watchdog thread sees a
death or a stop at once, kills the other ranks and, unless rank 0 stops by itself within a grace
period, ends the process (exit status 2, one line naming the rank and the phase)."""

from __future__ import annotations

import copy
import os
import signal
import threading
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..distributed import World
from ..errors import InputError, RankFailure
from ..options import load_model
from . import watchdog
from .loading import ShardedLoad
from .mesh import DEFAULT_TIMEOUT_S, check_tp, first_line, free_port, init_group
from .mirror import Mirror, fail, follow, injected_fault
from .sharding import shard_model
from .watchdog import ANNOUNCED, JOINED, LOADED, SERVING

GRACE_S = 10.0  # how long rank 0 may take to stop on its own after a rank failed
SERVER_GRACE_S = 60.0  # a server's: it fails its requests in flight first


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
    return shard_model(load_model(args, shard=ShardedLoad(group), quiet=group.rank != 0), group)


def worker_main(args, rank: int, size: int, port: int, timeout_s: float, board, report, parent: int) -> None:
    """Ranks 1 .. N-1: announce, join, load and shard, follow rank 0 until it stops or goes."""
    watchdog.leave_with_parent(parent)  # rank 0 gone during this process's imports: it ends here
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    args = _rank_args(args, rank)
    try:
        board[rank] = ANNOUNCED
        fault = injected_fault(rank)
        if fault is not None and fault[0] == 0:  # step 0: announced, but never joins
            fail(fault[1])
        watchdog.wait_for_rank0(board, ANNOUNCED, timeout_s)
        group = init_group(rank, size, port, torch.device(args.device), timeout_s)
        board[rank] = JOINED
        lm = sharded_model(args, group)
        board[rank] = LOADED
        watchdog.wait_for_rank0(board, SERVING, timeout_s)
        follow(lm, group)
        dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - whatever it was, rank 0 must hear it
        report.send(first_line(error) if not isinstance(error, RankFailure) else str(error))
        report.close()
        os._exit(3 if isinstance(error, RankFailure) else 2)


class Ranks:
    """Rank 0's handle on ranks 1 .. N-1: their processes, the board, their pipes, the watchdog."""

    def __init__(self, args, size: int, timeout_s: float):
        context = mp.get_context("spawn")
        self.port, self.timeout_s = free_port(), timeout_s
        self.board = context.RawArray("i", size)  # shared memory, no semaphore (nothing to leak)
        pipes = [context.Pipe(duplex=False) for _ in range(1, size)]
        self.reports = [reader for reader, _ in pipes]
        self.processes = [
            context.Process(
                target=worker_main,
                daemon=True,
                args=(args, rank, size, self.port, timeout_s, self.board, writer, os.getpid()),
            )
            for rank, (_, writer) in enumerate(pipes, start=1)
        ]
        self._phase = "starting"  # rank 0's, named in a failure (mirror.py: idle / decoding)
        self.mirror = None
        self.verdict: str | None = None
        self.failed = threading.Event()
        self.finished = False
        self.on_failure = None  # called with the verdict (a server fails its requests and stops)
        for process in self.processes:
            process.start()
        for _, writer in pipes:
            writer.close()  # rank 0 keeps the readers only: a rank's death closes its pipe
        self._clock = watchdog.StopClock(timeout_s)
        self._watcher = threading.Thread(target=self._watch, name="caidllm-tp-watchdog", daemon=True)
        self._watcher.start()

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        self._phase = phase
        watchdog.trace(phase)

    def current_phase(self) -> str:
        if self.phase == "serving" and self.mirror is not None:
            return self.mirror.activity()
        return self.phase

    def _verdict(self) -> str | None:
        """The first fault among the ranks now, one line naming the rank (None: all well)."""
        for rank, (process, report) in enumerate(zip(self.processes, self.reports), start=1):
            code = process.exitcode
            try:
                if report.poll():  # a rank that raised sends first, then exits
                    return f"tensor-parallel rank {rank} failed: {report.recv()}"
            except (EOFError, OSError):  # the rank is gone (its exit status says how), or stop() closed it
                pass
            if code not in (None, 0):
                return f"tensor-parallel rank {rank} {watchdog.exit_text(code)}"
            if code is None and self._clock.hung(process.pid):
                return f"tensor-parallel rank {rank} hung (stopped for {self.timeout_s:g} s, --tp-timeout)"
        return None

    def _watch(self) -> None:
        started = time.monotonic()
        while not self.finished and self.verdict is None:
            time.sleep(0.1)
            verdict = self._verdict()
            if (
                verdict is None
                and self.phase == "starting"
                and time.monotonic() - started > watchdog.START_LIMIT_S
            ):
                verdict = f"the tensor-parallel ranks did not start within {watchdog.START_LIMIT_S:g} s"
            if verdict is not None and not self.finished:
                self._fail(f"{verdict} while {self.current_phase()}")

    def _fail(self, verdict: str) -> None:
        self.verdict = verdict
        self.kill()  # rank 0's waits on them end at once
        self.failed.set()
        if self.on_failure is not None:
            self.on_failure(verdict)
        time.sleep(GRACE_S if self.on_failure is None else SERVER_GRACE_S)
        if not self.finished:
            watchdog.say(f"{verdict}; stopping every rank")
            os._exit(2)

    def failure(self, fallback: str | None = None) -> str | None:
        """The watchdog's verdict (given a moment to come: a rank's death ends rank 0's collective
        as it happens), else `fallback`."""
        self.failed.wait(2.0 if fallback is not None else 0.0)
        return self.verdict or fallback

    def raise_failure(self) -> None:
        if self.verdict is not None:
            raise RankFailure(self.verdict)

    def wait_for(self, stage: int) -> None:
        """Rank 0: wait until every other rank has reached `stage` (the watchdog bounds the wait)."""
        while min(self.board[1:]) < stage:
            if self.failed.wait(0.02):
                raise RankFailure(self.verdict)

    def kill(self) -> None:
        for process in self.processes:
            if process.exitcode is None:
                process.kill()

    def stop(self, wait_s: float = 5.0) -> None:
        self.finished = True
        deadline = time.monotonic() + wait_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self.kill()
        for process in self.processes:
            process.join(1.0)
        if threading.current_thread() is not self._watcher:
            self._watcher.join(1.0)  # it sees `finished` within 0.1 s: then nothing reads the pipes
        for report in self.reports:
            report.close()


def check_parallel(args, tp: int) -> float:
    """What --tp refuses before any rank starts; the group's timeout."""
    timeout_s = getattr(args, "tp_timeout", None)
    if tp == 1:
        if timeout_s is not None:
            raise InputError("--tp-timeout applies to --tp N (N > 1) only; drop it or add --tp")
        return DEFAULT_TIMEOUT_S
    if getattr(args, "compile", False) or getattr(args, "quantize", None):
        raise InputError(
            "--tp does not take --compile or --quantize yet (their kernels would replace the sharded "
            "layers' sums); run --tp without them"
        )
    if World.from_env().distributed:
        raise InputError(
            "--tp spawns its own ranks; run it without torchrun (replicas of a sharded model "
            "are not supported)"
        )
    check_tp(tp, model_config(args.model), rank_device(args.device, 0))
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if not timeout_s > 0:
        raise InputError(f"--tp-timeout must be a positive number of seconds, got {timeout_s!r}")
    return timeout_s


def check_method(decode_config, tp: int) -> None:
    """A decoder the ranks cannot run, refused before they start (the engine refuses it too, later)."""
    if tp > 1 and getattr(decode_config, "cache", None) == "elastic":  # (a uniform family: its own config)
        raise InputError(
            f"cache mode 'elastic' reads each layer's attention over every head, which --tp {tp} "
            "divides among the ranks; run it without --tp"
        )


@contextmanager
def parallel_model(args, tp: int, timeout_s: float | None = None):
    """Rank 0's sharded model over `tp` ranks spawned for it (tp 1: the whole model, no ranks);
    on leaving, the other ranks are told to stop and joined (killed past a few seconds)."""
    checked = check_parallel(args, tp)
    if tp == 1:
        yield load_model(args)
        return
    timeout_s = checked if timeout_s is None else timeout_s
    ranks = Ranks(args, tp, timeout_s)
    clean, previous = False, _end_ranks_on_sigterm(ranks)
    try:
        lm = _form_and_load(args, ranks, tp, timeout_s)
        yield lm
        ranks.phase = "stopping"
        lm.mirror.stop()
        clean = True
    except RankFailure as error:
        raise RankFailure(ranks.failure(f"{error} while {ranks.current_phase()}")) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        ranks.stop(wait_s=10.0 if clean else 0.0)  # after a failure nothing is left for them to do
        if dist.is_initialized():
            dist.destroy_process_group()


def _end_ranks_on_sigterm(ranks: Ranks):
    """SIGTERM to rank 0 (a command's default: it ends) ends the ranks too, even those still importing
    (PR_SET_PDEATHSIG takes effect once their imports are done); a server installs its own drain later."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return None

    def end(signum, frame):
        ranks.kill()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, end)
    return previous


def _form_and_load(args, ranks: Ranks, tp: int, timeout_s: float):
    """Rank 0: wait for the ranks to announce themselves, form the group, load, start the mirror."""
    ranks.wait_for(ANNOUNCED)
    ranks.phase, ranks.board[0] = "forming the group", ANNOUNCED
    device = rank_device(args.device, 0)
    try:
        group = init_group(0, tp, ranks.port, device, timeout_s)
    except RankFailure as error:
        late = [str(r) for r in range(1, tp) if ranks.board[r] < JOINED]
        raise RankFailure(f"{error}; rank {', '.join(late) or '?'} did not join") from None
    ranks.phase = "loading"
    lm = sharded_model(_rank_args(args, 0), group)
    ranks.wait_for(LOADED)
    lm.mirror, lm.tp_ranks = Mirror(group, timeout_s), ranks
    ranks.mirror, ranks.phase, ranks.board[0] = lm.mirror, "serving", SERVING
    return lm
