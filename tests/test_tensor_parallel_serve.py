"""`caidllm serve --tp 2`: the same answers as one process; a rank that dies mid-request gives
that request a 5xx with an error body, then the server stops by itself with exit status 2 and
one line naming the rank (never a hang)."""

from __future__ import annotations

import os

import httpx

from helpers.serve import free_port, spawn_serve, start, wait_until

FLAGS = ("--tp", "2", "--method", "fastdllm", "--gen-length", "16", "--block-length", "8")
BODY = {
    "model": "tiny",
    "prompt": "Question: 17 + 25 = ? Answer:",
    "max_tokens": 16,
    "method": "fastdllm",
    "block_length": 8,
}


def completion(port_or_url) -> httpx.Response:
    url = port_or_url if isinstance(port_or_url, str) else f"http://127.0.0.1:{port_or_url}"
    return httpx.post(f"{url}/v1/completions", json=BODY, timeout=120)


def test_serve_tp_2_answers_as_one_process(tiny):
    with start(tiny) as server:
        alone = completion(server.url).json()
    port = free_port()
    proc = spawn_serve(port, *FLAGS)
    try:
        sharded = completion(port).json()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert sharded["choices"] == alone["choices"] and sharded["usage"] == alone["usage"]
    assert proc.returncode == 0 and "leaked" not in out  # no semaphore left to the resource tracker


def test_a_rank_dying_mid_request_gives_5xx_then_the_server_exits(monkeypatch):
    monkeypatch.setitem(os.environ, "CAIDLLM_TP_FAULT", "1:1:die")
    port = free_port()
    proc = spawn_serve(port, *FLAGS)
    try:
        answer = completion(port)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answer.status_code >= 500 and "peer rank failed or hung" in answer.json()["error"]["message"]
    assert proc.returncode == 2
    # the line names the phase too (issue 48): which of forming, loading, idle, decoding, draining it
    # interrupted
    assert (
        out.strip().splitlines()[-1]
        == "caidllm: error: tensor-parallel rank 1 died (exit status 9) while decoding"
    )


def test_a_failed_rank_is_named_by_health_and_every_refusal(tiny):
    """What the watchdog's verdict does to a server (serve/shutdown.py Shutdown.fail): /health 503 naming
    the rank at once, new requests refused naming it (issue 48: before, "draining" and "shutting down")."""
    verdict = "tensor-parallel rank 1 hung (stopped for 5 s, --tp-timeout) while idle"
    server = start(tiny, shutdown_grace=30.0)
    with server:
        server.config.app.state.shutdown.fail_from_thread(verdict)
        assert wait_until(lambda: httpx.get(f"{server.url}/health").status_code == 503, 10)
        assert httpx.get(f"{server.url}/health").json()["status"] == "failed"
        assert httpx.get(f"{server.url}/health").json()["error"] == verdict
        refused = completion(server.url)
        assert (
            refused.status_code == 503
            and refused.json()["error"]["message"] == f"the server is shutting down: {verdict}"
        )
