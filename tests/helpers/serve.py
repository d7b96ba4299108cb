"""Helpers of the server tests: a live app on a free 127.0.0.1 port, its metrics, `caidllm serve`
as a subprocess."""

import os
import socket
import subprocess
import sys
import time

import httpx

from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults

PROMPT = "not ( True ) and ( True ) is"
SETTINGS = dict(gen_length=64, block_length=16)
# A request that outlasts any grace or wait in the serve tests: one block, so the early end after the
# answer's EOS (which skips later blocks) cannot shorten it; 256 vanilla steps, ~9 s alone on 1 core.
LONG = {"prompt": PROMPT, "method": "vanilla", "gen_length": 256, "block_length": 256}


def start(lm, max_gen_length=256, **kw):
    defaults = ServerDefaults(
        model_name="tiny", gen_length=64, block_length=16, max_gen_length=max_gen_length
    )
    return LocalServer(create_app(lm, ServerConfig(defaults=defaults, **kw)))


def metric(url, name, headers=None):
    text = httpx.get(f"{url}/metrics", headers=headers).text
    line = next(row for row in text.splitlines() if row.startswith(name + " ") or row.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


def wait_until(condition, timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return condition()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_serve(port: int, *flags: str) -> subprocess.Popen:
    """`caidllm serve --model tiny` on the CPU on `port`; returns once /health answers."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "caidllm.cli", "serve", "--port", str(port), "--device", "cpu", *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def healthy():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return proc.poll() is not None

    wait_until(healthy, 90, every=0.3)
    return proc


def assert_refused(url: str, body: dict, param: str, words: str) -> None:
    """A chat completion with `body` is refused with HTTP 400 naming `param`, its message saying `words`."""
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "two and two"}], **body},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]


def streamed_commit_events(url: str, messages: list[dict]) -> list[dict]:
    """The commit events (what the live view draws) of a streamed chat completion, early stop off."""
    import json

    events = []
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        timeout=120,
        json={"messages": messages, "stream": True, "commit_events": True, "early_stop": False},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events += json.loads(line[6:]).get("caidllm", {}).get("commit_events", [])
    return events
