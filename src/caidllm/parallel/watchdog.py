"""How every rank fault of ``--tp N`` ends in bounded time, whatever the ranks are doing.

Three mechanisms, each chosen because it works while the interpreter lock is held (a rank in
torch's C++ store connect holds it for minutes, so a Python watchdog thread in that rank never runs):

* a rank never outlives rank 0: each rank asks the kernel for SIGKILL when its parent goes
  (``prctl(PR_SET_PDEATHSIG)``, Linux; elsewhere a thread polls the parent, the old fallback);
* rank 0 watches the ranks from outside: their exit status (a death is seen within a tenth of a
  second) and their scheduler state in /proc (a rank stopped, SIGSTOP, for ``--tp-timeout`` seconds
  counts as hung), plus the one-line error a rank that raised sends on its own pipe;
* every wait on a peer is bounded by ``--tp-timeout``: forming the group (all ranks announce
  themselves on a shared board first, so joining itself takes well under a second), the forward's
  sums, and the control messages (rank 0 sends a keep-alive while idle, mirror.py).

On a verdict rank 0 kills the other ranks (their work is lost anyway), so its own collectives end
at once; the command then ends with one line naming the rank and the phase (exit status 2)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

# A rank's progress on the shared board (one int per rank, rank 0's included).
SPAWNED, ANNOUNCED, JOINED, LOADED, SERVING = 0, 1, 2, 3, 4
PR_SET_PDEATHSIG = 1
START_LIMIT_S = 600.0  # a running rank that has not announced itself by then (imports) is given up on


def leave_with_parent(parent: int) -> None:
    """This rank ends (SIGKILL) as soon as rank 0 does, even while it holds the interpreter lock."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # not Linux: a thread polls (it needs the interpreter lock)
        threading.Thread(target=_poll_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # rank 0 went before the request took effect
        os._exit(3)


def _poll_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(3)


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of process `pid` (R, S, D, T stopped, t traced, Z), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()[0] if ")" in text else None


def exit_text(code: int) -> str:
    """How a rank ended, as a user reads it."""
    if code < 0:
        try:
            return f"died (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"died (killed by signal {-code})"
    if code == 3:
        return "left the group (exit status 3: it lost rank 0)"
    return f"died (exit status {code})"


class StopClock:
    """How long each watched process has been stopped (SIGSTOP): a stop counts as a hang once it has
    lasted the group's timeout, so a job suspended and resumed at once (Ctrl-Z, fg) goes on."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._since: dict[int, float] = {}

    def hung(self, pid: int) -> bool:
        if process_state(pid) not in ("T", "t"):
            self._since.pop(pid, None)
            return False
        since = self._since.setdefault(pid, time.monotonic())
        return time.monotonic() - since >= self.timeout_s


def wait_for_rank0(board, stage: int, timeout_s: float) -> None:
    """A rank other than 0: wait until rank 0 has reached `stage` on the board (rank 0 dying ends this
    process through PR_SET_PDEATHSIG; rank 0 stopped for `timeout_s` ends it with a RankFailure)."""
    from ..errors import RankFailure

    clock, parent = StopClock(timeout_s), os.getppid()
    while board[0] < stage:
        if clock.hung(parent):
            raise RankFailure(f"rank 0 was stopped for {timeout_s:g} s (--tp-timeout)")
        time.sleep(0.02)


def trace(phase: str) -> None:
    """The fault tests' view of rank 0's phase: appended to $CAIDLLM_TP_TRACE when it is set."""
    path = os.environ.get("CAIDLLM_TP_TRACE")
    if path:
        with open(path, "a") as f:
            f.write(phase + "\n")


def say(line: str) -> None:
    print(f"caidllm: error: {line}", file=sys.stderr, flush=True)
