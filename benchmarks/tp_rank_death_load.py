"""Requests answered vs errors when a rank of `caidllm serve --tp 2` dies under load (issue 48):
8 clients send completions back to back; after a few answered, rank 1 is killed (SIGKILL). Prints
how many were answered (200) before it, how many ended with an error (by status) and how the
server ended (exit status, seconds from the kill, its last line).

    OMP_NUM_THREADS=1 python benchmarks/tp_rank_death_load.py [--clients 8] [--signal SIGKILL]
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.serve import free_port
from helpers.tp_faults import _alive, _children, _healthy, _wait

SRC = str(Path(__file__).resolve().parents[1] / "src")
BODY = {
    "model": "tiny",
    "prompt": "Question: 17 + 25 = ? Answer:",
    "max_tokens": 64,
    "block_length": 8,
    "method": "fastdllm",
}


def client(url: str, outcomes: list, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            status = str(httpx.post(f"{url}/v1/completions", json=BODY, timeout=60).status_code)
        except httpx.HTTPError as error:
            status = type(error).__name__
        outcomes.append((time.monotonic(), status))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--signal", default="SIGKILL")
    parser.add_argument("--answered-before", type=int, default=16, help="answers before the rank is killed")
    opts = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "caidllm",
            "serve",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--tp",
            "2",
            "--tp-timeout",
            "5",
            "--port",
            str(port),
            "--max-batch",
            "8",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if not _wait(lambda: _healthy(url), 180):
        proc.kill()
        raise SystemExit("the server did not start")
    outcomes: list = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=client, args=(url, outcomes, stop), daemon=True) for _ in range(opts.clients)
    ]
    for t in threads:
        t.start()
    _wait(lambda: sum(s == "200" for _, s in outcomes) >= opts.answered_before, 300)
    rank1 = next(p for p in _children(proc.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text())
    os.kill(rank1, getattr(signal, opts.signal))
    killed = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    ended = time.monotonic() - killed
    time.sleep(1.0)  # the clients' last attempts (connection refused) come in
    stop.set()
    before = collections.Counter(s for t, s in outcomes if t < killed)
    after = collections.Counter(s for t, s in outcomes if t >= killed and s != "ConnectError")
    refused = sum(1 for t, s in outcomes if t >= killed and s == "ConnectError")
    print(
        f"{opts.clients} clients, rank 1 {opts.signal}: before it {dict(before)}; from it to the server's "
        "end "
        f"{dict(after)} (then {refused} connections refused: the server had gone); server exit "
        f"{proc.returncode} "
        f"{ended:.1f} s after the kill; rank processes left: {sum(_alive(p) for p in [rank1])}; last line: "
        f"{out.strip().splitlines()[-1]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
