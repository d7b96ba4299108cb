"""`caidllm serve --replicas 2` on a local Ray instance: 16 requests through the
openai client (streamed and not) are all answered, as the single server
answers them, by both replicas (X-Caidllm-Replica); each replica's /metrics
is reachable on its own port."""

import re
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'caidllm[ray]')")
pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

from caidllm.cli import build_parser  # noqa: E402
from caidllm.errors import InputError  # noqa: E402
from caidllm.serve import replicas  # noqa: E402

PROMPTS = [
    "not ( True ) and ( True ) is",
    "True and not not ( not False ) is",
    "not True or ( False and True ) is",
    "False or not ( True ) and True is",
    "( 3 + 4 ) * 2 =",
    "7 - 2 * 3 =",
    "not not True is",
    "2 + 2 * 2 =",
]


def _free_ports(n: int) -> int:
    """A port p with p .. p+n-1 free on 127.0.0.1 (Ray's proxy, then the replicas' metrics)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        try:
            sockets = []
            for port in range(base, base + n):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free ports")


@contextmanager
def _deadline(seconds: int):
    """Fail (instead of hanging) if the block takes longer than `seconds`."""

    def expired(signum, frame):
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _args(*extra):
    return build_parser().parse_args(
        [
            "serve",
            "--model",
            "tiny",
            "--host",
            "127.0.0.1",
            "--gen-length",
            "32",
            "--block-length",
            "16",
            *extra,
        ]
    )


def test_bad_replica_flags_exit_2_before_ray_starts(capsys):
    from caidllm.cli import main

    assert main(["serve", "--model", "tiny", "--replicas", "0"]) == 2
    assert "--replicas must be at least 1" in capsys.readouterr().err
    assert not ray.is_initialized()  # runs first: no test has started Ray yet


@pytest.fixture(scope="module")
def ray_server():
    from ray import serve

    from caidllm.serve import ray_deployment

    base = _free_ports(3)
    args = _args("--replicas", "2", "--port", str(base), "--replica-metrics-port", str(base + 1))
    try:
        with _deadline(240):  # Ray, its proxy and two replicas up
            # "local": a Ray instance of this test's own; by default ray.init joins any Ray session
            # running on the machine (another test's, or one left over), whose shutdown kills our proxy.
            ray.init(
                address="local",
                num_cpus=2,
                num_gpus=0,
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
            )
            ray_deployment.start(args)
        yield f"http://127.0.0.1:{base}", [base + 1, base + 2]
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def single_server():
    import caidllm
    from caidllm.serve.app import create_app
    from caidllm.serve.cli import settings_from
    from caidllm.serve.local import LocalServer

    lm = caidllm.load("tiny")
    with LocalServer(create_app(lm, settings_from(_args(), lm))) as server:
        yield server.url


def _ask(url: str, prompt: str, stream: bool) -> tuple[str, str]:
    """(answer text, replica) of one chat completion."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=32, stream=stream
    )
    replica = raw.headers.get("x-caidllm-replica")
    body = raw.parse()
    if stream:
        text = "".join(chunk.choices[0].delta.content or "" for chunk in body if chunk.choices)
    else:
        text = body.choices[0].message.content
    return text, replica


def _all(url: str) -> list[tuple[str, str]]:
    jobs = [(p, stream) for p in PROMPTS for stream in (False, True)]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda job: _ask(url, *job), jobs))


def test_two_replicas_answer_as_the_single_server(ray_server, single_server):
    url, metrics_ports = ray_server
    with _deadline(240):
        got, want = _all(url), _all(single_server)
    assert len(got) == 16 and all(text for text, _ in got)
    assert [text for text, _ in got] == [text for text, _ in want]
    used = {replica for _, replica in got}
    assert len(used) == 2 and all(r.startswith("caidllm#") for r in used), used

    completed = 0
    for port in metrics_ports:  # each replica's own /metrics
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        found = re.search(r'caidllm_requests_total\{outcome="completed"\} ([0-9.]+)', text)
        assert found, text[:500]
        completed += float(found.group(1))
    assert completed == 16
    proxied = httpx.get(f"{url}/metrics", timeout=10)  # through the proxy: one replica's, named in the header
    assert proxied.status_code == 200 and proxied.headers["x-caidllm-replica"] in used
    assert httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"] == "tiny"


def test_deployment_options_pass_ray_serve_settings_through():
    args = _args("--replicas", "3", "--ray-options", '{"max_ongoing_requests": 4}')
    assert replicas.deployment_options(args, gpus_in_cluster=True) == {
        "num_replicas": 3,
        "ray_actor_options": {"num_gpus": 1},
        "max_ongoing_requests": 4,
    }
    auto = _args(
        "--replicas", "1", "--ray-options", '{"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}}'
    )
    options = replicas.deployment_options(auto, gpus_in_cluster=False)
    assert "num_replicas" not in options and options["autoscaling_config"]["max_replicas"] == 4
    assert options["ray_actor_options"] == {"num_cpus": 1}
    for bad, message in (
        (["--replicas", "0"], "at least 1"),
        (["--replicas", "2", "--ray-options", "{"], "JSON"),
        (["--replicas", "2", "--ray-options", "[1]"], "JSON object"),
        (["--replicas", "2", "--max-batch", "0"], "max-batch"),
        (["--replicas", "2", "--method", "warp"], "unknown method"),
    ):
        with pytest.raises(InputError, match=message):
            replicas.check(_args(*bad))  # before Ray starts
