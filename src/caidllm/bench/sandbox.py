"""Run untrusted generated programs (HumanEval / MBPP completions) for pass@1.

Each program runs in its own process tree, never in the benchmark process:

* a fresh temporary working directory (removed afterwards), the program
  written there as ``program.py``; stdout/stderr go to files in a second
  private directory, so a chatty program cannot exhaust the parent's memory;
* ``python -I`` (isolated mode: no PYTHON* variables, no user site, no script
  directory on sys.path) with an almost empty environment;
* resource limits set before exec: RLIMIT_AS (address space), RLIMIT_CPU
  (CPU seconds), RLIMIT_FSIZE (largest file it may write: a disk-filling loop
  gets SIGXFSZ), RLIMIT_NPROC (processes of the user: stops fork bombs),
  RLIMIT_CORE = 0;
* a new session (process group); on a wall-clock timeout the whole group is
  killed with SIGKILL;
* when running as root (RLIMIT_NPROC is not enforced for root) the program
  drops to the unprivileged user ``nobody`` before it starts, so the process
  limit applies, it cannot write outside its working directory and /tmp, and
  it cannot read files that are not world-readable;
* when the ``unshare`` command works (root, or unprivileged user namespaces),
  the tree also gets a new network namespace (no network at all: not even
  loopback is up) and a new PID namespace created with ``--kill-child``: when
  the program's first process ends or is killed, the kernel kills every
  process left in the namespace, including ones that left the process group;
* best effort in every case: ``socket.socket`` is replaced by a class whose
  constructor raises, so ordinary network calls fail even without a network
  namespace.

Not isolated (documented, not hidden): a program can read world-readable
files anywhere (e.g. the benchmark data or this source tree), use /tmp within
its file-size limit, and use CPU up to its limits. Without root and without
``unshare``, processes that start their own session can outlive the timeout
and network isolation is only the Python-level socket guard. This is a
safety net for evaluating model output, not a security boundary against a
determined attacker; run untrusted models in a container or VM.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

STATUSES = ("passed", "failed", "timeout", "error")
NOBODY = 65534
STDERR_TAIL = 2000

# Runs inside the sandbox, before the program: drop root, block sockets, then
# execute program.py as __main__. Written by us, so it is trusted code.
_RUNNER = r"""
import os, socket, sys
uid, gid, preimport = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
class _NoNetwork(socket.socket):
    def __init__(self, *args, **kwargs):
        raise OSError("network access is disabled in the caidllm sandbox")
socket.socket = _NoNetwork
if os.getuid() == 0 and uid >= 0:
    for name in filter(None, preimport.split(",")):
        try:
            __import__(name)
        except ImportError:
            pass
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
os.environ["HOME"] = os.getcwd()
del uid, gid, preimport, _NoNetwork
sys.argv = [sys.argv[1]]
sys.path.insert(0, os.getcwd())
with open(sys.argv[0], encoding="utf-8") as _f:
    _code = compile(_f.read(), sys.argv[0], "exec")
del _f
exec(_code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__})
"""


@dataclass
class SandboxResult:
    status: str  # passed | failed | timeout | error
    returncode: int | None
    duration_s: float
    reason: str  # one line: why it failed / timed out / errored ("" when passed)
    stderr_tail: str  # the last STDERR_TAIL characters of stderr
    isolation: str  # what was applied, e.g. "nobody+netns+pidns+rlimits"

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock
    memory_mb: int = 2048  # RLIMIT_AS
    cpu_s: int | None = None  # RLIMIT_CPU; default: ceil(timeout) + 1
    file_size_mb: int = 16  # RLIMIT_FSIZE
    processes: int = 32  # RLIMIT_NPROC headroom (per sandboxed user)


@lru_cache(maxsize=1)
def _unshare_flags() -> tuple[str, ...] | None:
    """The unshare prefix if this machine lets us create network + PID
    namespaces, else None. Probed once."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    flags = (exe, "--net", "--pid", "--fork", "--kill-child")
    try:
        done = subprocess.run([*flags, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return flags if done.returncode == 0 else None


# Imported before dropping to `nobody` when the interpreter's standard library
# is not readable by other users (e.g. a Python installed under /root): the
# modules HumanEval / MBPP solutions use. Anything else fails to import there.
PREIMPORT = (
    "abc",
    "array",
    "ast",
    "base64",
    "binascii",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "contextlib",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "io",
    "itertools",
    "json",
    "linecache",
    "math",
    "numbers",
    "operator",
    "queue",
    "random",
    "re",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "time",
    "traceback",
    "typing",
    "unicodedata",
)


@lru_cache(maxsize=1)
def _stdlib_readable_by_others() -> bool:
    """True when every directory down to the standard library (and its
    extension modules) can be entered and read by any user."""
    import sysconfig

    for key in ("stdlib", "platstdlib"):
        path = Path(sysconfig.get_paths()[key]).resolve()
        for part in [*reversed(path.parents), path]:
            try:
                mode = part.stat().st_mode
            except OSError:
                return False
            if not mode & 0o001:
                return False
        if not path.stat().st_mode & 0o004:
            return False
    return True


def _count_processes(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def isolation_summary() -> str:
    parts = ["nobody" if os.getuid() == 0 else "same-user"]
    if os.getuid() == 0 and not _stdlib_readable_by_others():
        parts.append("preimported-stdlib")
    if _unshare_flags():
        parts += ["netns", "pidns"]
    else:
        parts.append("socket-guard")
    parts += ["rlimits", "session-kill", "tempdir"]
    return "+".join(parts)


def run_program(source: str, limits: Limits = Limits()) -> SandboxResult:
    """Execute Python `source` in a sandbox; passed = exit status 0.

    A failing assert gives "failed"; a wall-clock or CPU timeout "timeout";
    anything else that is not a clean exit (syntax error, exception, memory
    or file-size limit, killed) "error". Never raises for what the program
    does."""
    root = os.getuid() == 0
    preexec = _child_limits(limits, root)
    workdir = Path(tempfile.mkdtemp(prefix="caidllm-sandbox-"))
    private = Path(tempfile.mkdtemp(prefix="caidllm-sandbox-io-"))
    started = time.perf_counter()
    try:
        runner = _write_program(source, workdir, private, root)
        returncode, timed_out = _run_to_end(
            _command(runner, root), workdir, private, preexec, limits.timeout_s
        )
        duration = time.perf_counter() - started
        stderr = _tail(private / "stderr")
        return _classify(returncode, timed_out, stderr, duration, limits)
    except OSError as error:  # could not even start it: record, never crash the run
        return SandboxResult(
            "error",
            None,
            time.perf_counter() - started,
            f"sandbox could not run the program: {error}",
            "",
            isolation_summary(),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _child_limits(limits: Limits, root: bool):
    """The function the child runs before exec: a new session (so the whole tree can be killed)
    and the resource limits."""
    cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 1
    if root:
        nproc = limits.processes + _count_processes(NOBODY)
    else:  # RLIMIT_NPROC counts every process of this user, so leave headroom
        nproc = limits.processes + _count_processes(os.getuid())

    def preexec():
        os.setsid()
        mem = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        size = limits.file_size_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return preexec


def _write_program(source: str, workdir: Path, private: Path, root: bool) -> Path:
    """program.py in the working directory (owned by `nobody` under root, private to it), and
    our trusted runner beside the output files, readable by all; returns the runner's path."""
    (workdir / "program.py").write_text(source)
    runner = private / "runner.py"
    runner.write_text(_RUNNER)
    os.chmod(private, 0o755)
    os.chmod(runner, 0o644)
    if root:
        os.chown(workdir, NOBODY, NOBODY)
        os.chown(workdir / "program.py", NOBODY, NOBODY)
    os.chmod(workdir, 0o700)
    return runner


def _command(runner: Path, root: bool) -> list[str]:
    """python -I on the runner, inside new namespaces where unshare works; under root the runner
    drops to `nobody` (after preimporting the stdlib when `nobody` could not read it)."""
    uid = gid = NOBODY if root else -1
    prefix = list(_unshare_flags() or ())
    preimport = "" if not root or _stdlib_readable_by_others() else ",".join(PREIMPORT)
    return [*prefix, sys.executable, "-I", str(runner), "program.py", str(uid), str(gid), preimport]


def _run_to_end(
    command: list[str], workdir: Path, private: Path, preexec, timeout_s: float
) -> tuple[int, bool]:
    """Run the program to its end or the wall-clock limit, then kill whatever it left behind;
    (return code, timed out). Its output goes to files, never to our memory."""
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "TMPDIR": str(workdir),
        "http_proxy": "http://0.0.0.0:9",
        "https_proxy": "http://0.0.0.0:9",
        "no_proxy": "",
    }
    with open(private / "stdout", "wb") as out, open(private / "stderr", "wb") as err:
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=preexec,
            close_fds=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc.pid)
        if timed_out:
            proc.wait()
    return proc.returncode, timed_out


def _kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process left in the program's process group (a passing
    program may have left children behind too) and wait, up to `wait_s`, until
    none is left running: the kernel tears a PID namespace down
    asynchronously."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if not _group_alive(pgid) or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` exists that is not a zombie."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * STDERR_TAIL))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")[-STDERR_TAIL:]


def _last_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _classify(
    returncode: int, timed_out: bool, stderr: str, duration: float, limits: Limits
) -> SandboxResult:
    iso = isolation_summary()
    if timed_out:
        return SandboxResult(
            "timeout", returncode, duration, f"wall-clock timeout after {limits.timeout_s:g} s", stderr, iso
        )
    # unshare re-raises the child's signal on itself, or exits 128+signal
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if returncode == 0:
        return SandboxResult("passed", 0, duration, "", stderr, iso)
    last = _last_error_line(stderr)
    if sig in (signal.SIGXCPU, signal.SIGKILL) and not last.startswith(("AssertionError", "Traceback")):
        return SandboxResult(
            "timeout", returncode, duration, f"CPU limit reached or killed (signal {sig})", stderr, iso
        )
    if sig == signal.SIGXFSZ or "File too large" in last:  # Python ignores SIGXFSZ: write() fails with EFBIG
        return SandboxResult(
            "error",
            returncode,
            duration,
            f"file size limit of {limits.file_size_mb} MiB exceeded (SIGXFSZ)",
            stderr,
            iso,
        )
    if last.startswith("AssertionError"):
        return SandboxResult("failed", returncode, duration, last[:200], stderr, iso)
    if last.startswith("MemoryError") or "MemoryError" in last:
        return SandboxResult(
            "error",
            returncode,
            duration,
            f"memory limit of {limits.memory_mb} MiB: {last[:150]}",
            stderr,
            iso,
        )
    reason = last[:200] if last else (f"killed by signal {sig}" if sig else f"exit status {returncode}")
    return SandboxResult("error", returncode, duration, reason, stderr, iso)
