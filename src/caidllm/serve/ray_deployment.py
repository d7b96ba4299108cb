"""The Ray Serve deployment of `caidllm serve --replicas N` (serve/replicas.py).

Every replica is an actor that loads the model, builds the FastAPI app of
serve/app.py around its own engine (Ray Serve then runs the app's lifespan,
which starts the engine thread) and names itself in `X-Caidllm-Replica`.
"""

from __future__ import annotations

import os
import signal
import socket
import threading

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine
# Serve's controller gives a new proxy actor 5 s to be ready and kills it past that ("killed by ray.kill ...
# cancelled before it started running"): a loaded machine takes longer to start its worker process and
# import the proxy. A Ray instance started here (its processes inherit this environment) waits longer.
for _name, _seconds in (
    ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "120"),
    ("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60"),
):
    os.environ.setdefault(_name, _seconds)

import ray  # noqa: E402
from ray import serve  # noqa: E402

from caidllm.serve import replicas  # noqa: E402

APP_NAME = "caidllm"


@serve.ingress()  # the app is built in each replica, by __serve_build_asgi_app__
class CaidllmReplica:
    def __init__(self, args):
        from caidllm.options import load_model
        from caidllm.serve.launch import settings_from

        self.lm = load_model(args)  # Ray gives a replica with num_gpus=1 its GPU as cuda:0
        self.settings = settings_from(args, self.lm)
        context = serve.get_replica_context()
        rank = context.rank.rank if context.rank is not None else 0
        self.settings.replica = f"{context.deployment}#{rank}@{socket.gethostname()}:{os.getpid()}"
        self.metrics_port = None if args.replica_metrics_port is None else args.replica_metrics_port + rank
        self.metrics_host = args.host

    def __serve_build_asgi_app__(self):
        from caidllm.serve.app import create_app

        app = create_app(self.lm, self.settings, engine_thread=True)
        if self.metrics_port is not None:  # this replica's /metrics at a port of its own
            from prometheus_client import start_http_server

            start_http_server(self.metrics_port, addr=self.metrics_host, registry=app.state.metrics.registry)
        return app


def build(args):
    """The Ray Serve application of N replicas (Ray must be initialised)."""
    gpus = ray.cluster_resources().get("GPU", 0) > 0
    options = replicas.deployment_options(args, gpus)
    return serve.deployment(CaidllmReplica, name="caidllm").options(**options).bind(args)


def start(args) -> bool:
    """Join or start Ray, start Serve's proxy on --host:--port and deploy; returns when the replicas are
    up: True if Ray was started here (not a cluster joined)."""
    replicas.check(args)  # before any replica
    started_here = False
    if not ray.is_initialized():
        # No address given: a Ray instance of our own ("local"), never another session's left running on
        # this machine (ray.init's default would join any it finds).
        address = args.ray_address or os.environ.get("RAY_ADDRESS") or "local"
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
        started_here = address == "local"
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build(args), name=APP_NAME, route_prefix="/")
    return started_here


def serve_until_stopped(args) -> int:
    started_here = start(args)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped.set())
    print(
        f"caidllm: {args.replicas} replicas on http://{args.host}:{args.port} (Ray Serve); Ctrl-C stops them",
        flush=True,
    )
    stopped.wait()
    serve.delete(APP_NAME)  # replicas finish what they are doing (Ray's graceful shutdown), then stop
    if started_here:  # on a cluster joined, Serve and its other applications stay up
        serve.shutdown()
    ray.shutdown()  # stops a local Ray; only disconnects from a cluster
    return 0
