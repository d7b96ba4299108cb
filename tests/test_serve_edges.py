"""The server's shutdown and HTTP edges (issue 36, part 4): the drain is visible (listener open,
503 with the OpenAI body), a second signal ends it, malformed framing gets the OpenAI body, a huge
token-id list is refused from its bytes, `--api-key ""` is refused, 401 names its scheme, HEAD works
where GET does, and the body timeout defaults to 10 s. Live servers on 127.0.0.1 with the tiny model."""

import argparse
import gc
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from caidllm.cli import build_parser
from caidllm.errors import InputError
from caidllm.serve.app import ServerConfig, _decode_and_parse
from caidllm.serve.http_edges import id_list_bounds
from caidllm.serve.launch import check_api_key
from caidllm.serve.protocol import RequestError, ServerDefaults
from helpers.serve import LONG, PROMPT, free_port, spawn_serve, start, wait_until

FAST = {"method": "fastdllm", "gen_length": 16, "block_length": 16}


@pytest.fixture(scope="module")
def server(tiny):
    with start(tiny, max_body_bytes=8_000_000) as s:
        yield s


def _stop(proc) -> str:
    if proc.poll() is None:
        proc.kill()
    return proc.stdout.read()


def test_the_drain_is_visible_until_the_grace_ends():
    """SIGTERM: the listener stays open; /health 503 draining (GET and HEAD), new requests 503 with the
    OpenAI body on new and kept-alive connections (the openai client sees it); exit 0 within grace + 1 s."""
    port, grace = free_port(), 3.0
    proc = spawn_serve(port, "--shutdown-grace", str(grace), "--gen-length", "16", "--block-length", "16")
    url = f"http://127.0.0.1:{port}"
    try:
        kept = httpx.Client(base_url=url, timeout=10)
        assert kept.get("/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 503, 2)
        health = httpx.get(f"{url}/health")
        assert health.json()["status"] == "draining" and httpx.head(f"{url}/health").status_code == 503
        for client in (kept, httpx.Client(base_url=url, timeout=10)):
            r = client.post("/v1/completions", json={"prompt": PROMPT, **FAST})
            assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10)
        with pytest.raises(openai.InternalServerError) as refused:
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, extra_body=FAST)
        assert refused.value.status_code == 503
        assert time.monotonic() - signalled < grace  # all of this while draining
        assert proc.wait(timeout=grace + 10) == 0
        exited = time.monotonic() - signalled
    finally:
        log = _stop(proc)
    print(f"drain with grace {grace:g} s: exit 0 after {exited:.2f} s")
    assert grace - 0.5 < exited < grace + 1.0, exited
    assert "Traceback" not in log, log


def test_a_second_signal_ends_the_drain_at_once():
    port, grace = free_port(), 60.0
    proc = spawn_serve(port, "--shutdown-grace", str(grace), "--gen-length", "16", "--block-length", "16")
    url, result = f"http://127.0.0.1:{port}", {}

    def call():
        result["long"] = httpx.post(f"{url}/v1/completions", json=LONG, timeout=60)

    try:
        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 503, 5)
        proc.send_signal(signal.SIGINT)
        second = time.monotonic()
        assert proc.wait(timeout=15) == 0
        exited = time.monotonic() - second
        thread.join(10)
    finally:
        log = _stop(proc)
    print(f"second signal, grace {grace:g} s: exit 0 after {exited:.2f} s")
    assert exited < 3.0, exited
    assert result["long"].status_code == 503 and result["long"].json()["error"]["code"] == "shutting_down"
    assert "Traceback" not in log, log


def _raw(url: str, request: bytes, skip: int = 0) -> tuple[int, dict]:
    """The status and JSON body of the response after the first `skip` (each with a Content-Length)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    for _ in range(skip + 1):
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = int(next(line.split(b":")[1] for line in lines if line.startswith(b"content-length")))
        body, data = data[:length], data[length:]
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        b"abc\r\n\r\n{}",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    ],
    ids=["bad-content-length", "bad-chunk-size", "bad-header-line"],
)
def test_malformed_http_gets_the_openai_body(server, request_bytes):
    status, body = _raw(server.url, request_bytes)
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and body["error"]["message"], (
        body
    )


def test_malformed_http_on_a_kept_alive_connection_gets_the_openai_body(server):
    """The second request on a connection (the first one answered) is malformed: it gets the 400 body too."""
    status, body = _raw(
        server.url,
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
        skip=1,
    )
    assert status == 400 and body["error"]["code"] == "bad_http_request", body


def test_a_huge_token_id_list_is_refused_from_its_bytes_while_others_answer(server):
    huge = '{"prompt": [' + "7," * 2_000_000 + '7], "max_tokens": 4}'  # 4 MB
    results = {}

    def small():
        results["small"] = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": PROMPT, **FAST}, timeout=60
        )

    thread = threading.Thread(target=small)
    thread.start()
    for _ in range(3):
        r = httpx.post(
            f"{server.url}/v1/completions",
            content=huge,
            headers={"content-type": "application/json"},
            timeout=60,
        )
        error = r.json()["error"]
        # Refused by the byte count ("about N token ids"), not after parsing 2 million ints.
        assert (
            r.status_code == 400
            and error["param"] == "prompt"
            and "about 2000001 token ids" in error["message"]
        )
    thread.join(60)
    assert results["small"].status_code == 200 and results["small"].json()["choices"][0]["text"]
    nested = '{"prompt": [[1, 2], [' + "7," * 100_000 + "7]]}"
    r = httpx.post(
        f"{server.url}/v1/completions", content=nested, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "about 100001 token ids" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body, bounds",
    [
        (b'{"prompt": [1, 2, 3], "max_tokens": 4}', (3, 0)),
        (b'{"prompt": [[1, 2], [3]]}', (2, 2)),
        # text: not an id list
        (
            b'{"prompt": ["a, b, c [1, 2, 3, 4]", "d"], "stop": ["[1,1,1,1,1]"]}',
            (1, 0),
        ),
        (b'{"prompt": [1], "prompt": [' + b"7," * 9 + b"7]}", (10, 0)),  # JSON takes the last of two keys
        (b'{"prompt": [null, ' + b"7," * 9 + b"7]}", (11, 0)),  # an entry that is not an id hides nothing
        (b'{"prompt": [1.5, 1e3, true, ' + b"7," * 9 + b"7]}", (13, 0)),
        (b'{"prompt": [' + b"[7]," * 99 + b"[7]]}", (1, 100)),  # many prompts of one id each
        (b'{"prompt": [' + b"[7]," * 4999 + b"[7]]}", (0, 5000)),  # past _SPLIT_LISTS: only counted
        (b'{"prompt": "text"}', (0, 0)),
    ],
)
def test_id_list_bounds_are_counted_from_the_bytes(body, bounds):
    assert id_list_bounds(body) == bounds
    assert json.loads(body)  # each is valid JSON


def test_many_short_id_lists_are_refused_from_their_bytes(server):
    """A million one-id prompts: refused by their count before json.loads builds a list for each."""
    many = '{"prompt": [' + "[7]," * 1_000_000 + "[7]]}"
    r = httpx.post(
        f"{server.url}/v1/completions", content=many, headers={"content-type": "application/json"}, timeout=60
    )
    error = r.json()["error"]
    assert (
        r.status_code == 400 and error["param"] == "prompt" and "about 1000001 prompts" in error["message"]
    ), error


def test_the_collector_is_paused_while_a_body_is_parsed_and_back_after(monkeypatch):
    """json.loads holds the interpreter; with the collector on, a million small lists took 2 s of it."""
    seen, real = [], json.loads
    monkeypatch.setattr(json, "loads", lambda raw: seen.append(gc.isenabled()) or real(raw))
    for raw in (b"[]", b"[", b'{"prompt": 1}'):  # not an object; not JSON; refused by the parser
        with pytest.raises(RequestError):
            _decode_and_parse(raw, "completion", None, ServerDefaults(model_name="tiny"))
    assert seen == [False] * 3 and gc.isenabled()


@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_api_key_is_refused(key):
    proc = subprocess.run(
        [sys.executable, "-m", "caidllm.cli", "serve", "--api-key", key, "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--api-key is empty" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "flag, env, refusal",
    [
        (None, "", "CAIDLLM_API_KEY is empty"),
        (None, " ", "CAIDLLM_API_KEY is empty"),
        (" k3y", None, "--api-key has spaces at its ends"),
        (None, "k3y\n", "CAIDLLM_API_KEY has spaces at its ends"),
    ],
)
def test_an_api_key_that_would_open_the_server_or_match_no_one_is_refused(monkeypatch, flag, env, refusal):
    monkeypatch.delenv("CAIDLLM_API_KEY", raising=False)
    if env is not None:
        monkeypatch.setenv("CAIDLLM_API_KEY", env)
    with pytest.raises(InputError, match=refusal):
        check_api_key(argparse.Namespace(api_key=flag))


def test_the_api_key_comes_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.setenv("CAIDLLM_API_KEY", "from-env")
    assert check_api_key(argparse.Namespace(api_key="from-flag")) == "from-flag"
    assert check_api_key(argparse.Namespace(api_key=None)) == "from-env"
    monkeypatch.delenv("CAIDLLM_API_KEY")
    assert check_api_key(argparse.Namespace(api_key=None)) is None


def test_a_401_names_its_scheme(tiny):
    with start(tiny, api_key="k3y") as s:
        r = httpx.get(f"{s.url}/v1/models")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        assert openai.OpenAI(base_url=f"{s.url}/v1", api_key="k3y").models.list().data[0].id == "tiny"


@pytest.mark.parametrize(
    "path", ["/health", "/v1/models", "/caidllm/info", "/metrics", "/", "/static/live.js"]
)
def test_head_works_where_get_does(server, path):
    got, head = httpx.get(server.url + path), httpx.head(server.url + path)
    assert got.status_code == 200 and head.status_code == 200, (head.status_code, head.text)
    assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]


def test_the_body_timeout_defaults_to_10_s():
    args = build_parser().parse_args(["serve"])
    assert args.body_timeout == 10.0
    assert ServerConfig(defaults=None).body_timeout == 10.0
