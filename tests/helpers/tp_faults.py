"""The fault matrix of `--tp 2` (issue 48): a signal (SIGKILL, SIGTERM, SIGSTOP) sent to rank 0 or
rank 1 of `caidllm generate --tp 2` or `caidllm serve --tp 2` in one phase (forming, idle,
decoding, draining); how the job ended, how many seconds after the signal, and which of its
processes were left. tests/test_tensor_parallel_faults.py runs a few cells,
benchmarks/tp_fault_matrix.py all of them (the table in BENCHMARKS.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SRC = str(Path(__file__).resolve().parents[2] / "src")
TIMEOUT_S = 5.0  # --tp-timeout of every cell
LIMIT_S = 90.0  # a cell that has not ended by then fails (everything it started is killed)
PHASES = {"generate": ("forming", "decoding"), "serve": ("forming", "idle", "decoding", "draining")}
SIGNALS = ("SIGKILL", "SIGTERM", "SIGSTOP")
LONG = 512  # a canvas long enough to be decoding when the signal comes (tiny: 1024 positions)


@dataclass
class Cell:
    command: str
    phase: str
    signal: str
    rank: int
    returncode: int | None = None
    seconds: float = 0.0  # from the signal to the job's end (its every process gone)
    left: list = field(default_factory=list)  # processes of the job still alive at the end
    last_line: str = ""
    answer: str = ""  # serve: the in-flight request's status, or what a new one got


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _env(trace: str) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": SRC,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "CAIDLLM_TP_TRACE": trace,
    }


def _command(cell: Cell, port: int) -> list[str]:
    common = [
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--tp",
        "2",
        "--tp-timeout",
        f"{TIMEOUT_S:g}",
        "--method",
        "fastdllm",
    ]
    if cell.command == "generate":
        return [
            sys.executable,
            "-m",
            "caidllm",
            "generate",
            "What is 17 + 25?",
            *common,
            "--gen-length",
            str(LONG),
            "--block-length",
            "8",
            "--no-early-stop",
        ]
    return [
        sys.executable,
        "-m",
        "caidllm",
        "serve",
        *common,
        "--port",
        str(port),
        "--gen-length",
        "16",
        "--block-length",
        "8",
        "--shutdown-grace",
        "5",
        "--log-level",
        "warning",
    ]


def _wait(condition, limit: float, every: float = 0.05) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(every)
    return False


def _phases(trace: str) -> list[str]:
    try:
        return Path(trace).read_text().split()
    except OSError:
        return []


def _long_request(url: str, answers: list) -> None:
    body = {
        "model": "tiny",
        "prompt": "What is 17 + 25?",
        "max_tokens": LONG,
        "block_length": 8,
        "method": "fastdllm",
        "early_stop": False,
    }
    try:
        answers.append(str(httpx.post(f"{url}/v1/completions", json=body, timeout=LIMIT_S).status_code))
    except httpx.HTTPError as error:
        answers.append(type(error).__name__)


def _reach_phase(cell: Cell, proc, trace: str, url: str, answers: list) -> None:
    """Bring the job to the cell's phase (raises TimeoutError if it does not get there)."""
    ok = True
    if cell.phase == "forming":
        ok = _wait(lambda: _children(proc.pid), 60)
        time.sleep(0.3)
    elif cell.command == "generate":
        ok = _wait(lambda: "decoding" in _phases(trace), 120)
    else:
        ok = _wait(lambda: _healthy(url), 120)
        time.sleep(1.5)  # past the start-up's warm-up step: idle
        if ok and cell.phase in ("decoding", "draining"):
            threading.Thread(target=_long_request, args=(url, answers), daemon=True).start()
            ok = _wait(lambda: "decoding" in _phases(trace), 60)
        if ok and cell.phase == "draining":
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
    if not ok or proc.poll() is not None:
        raise TimeoutError(f"{cell.command} did not reach phase {cell.phase}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def run_cell(cell: Cell) -> Cell:
    """Run one cell; every process it started is gone when this returns."""
    from helpers.serve import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    trace = tempfile.mktemp(prefix="caidllm-tp-trace-")  # rank 0 writes it (CAIDLLM_TP_TRACE)
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - the job writes it; read and closed in finally
    proc = subprocess.Popen(
        _command(cell, port), env=_env(trace), stdout=log, stderr=subprocess.STDOUT, text=True
    )
    answers: list = []
    family = [proc.pid]
    try:
        _reach_phase(cell, proc, trace, url, answers)
        family += _children(proc.pid)
        ranks = [
            p for p in family[1:] if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
        ]
        target = proc.pid if cell.rank == 0 else ranks[0]
        os.kill(target, getattr(signal, cell.signal))
        sent = time.monotonic()
        if cell.rank == 0 and cell.signal == "SIGSTOP":  # the ranks must leave; then rank 0 resumes and ends
            _wait(lambda: not any(_alive(p) for p in ranks), LIMIT_S)
            os.kill(proc.pid, signal.SIGCONT)
        if cell.command == "serve" and cell.phase != "forming" and not answers:
            _long_request(url, answers)  # what a request sent now gets (refused, or the server is gone)
        _wait(lambda: proc.poll() is not None and not any(_alive(p) for p in family[1:]), LIMIT_S, every=0.02)
        cell.seconds = time.monotonic() - sent
    finally:
        cell.left = [p for p in family if _alive(p)]
        for pid in cell.left:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(5)
        cell.returncode = proc.returncode
        log.seek(0)
        lines = [line for line in log.read().splitlines() if line.strip()]
        cell.last_line = lines[-1] if lines else ""
        cell.answer = ",".join(answers)
        log.close()
        Path(trace).unlink(missing_ok=True)
    return cell


def cells():
    return [
        Cell(command, phase, sig, rank)
        for command, phases in PHASES.items()
        for phase in phases
        for sig in SIGNALS
        for rank in (0, 1)
    ]


def expected_returncode(cell: Cell) -> tuple:
    """How each cell must end: rank 0 killed or terminated as a plain command is; a server drains on
    SIGTERM (exit 0); every other fault is a rank failure reported in one line (exit 2)."""
    if cell.rank == 0 and cell.signal == "SIGKILL":
        return (-9,)
    if cell.rank == 0 and cell.signal == "SIGTERM":
        return (-15,) if cell.command == "generate" or cell.phase == "forming" else (0,)
    return (2,)
