"""`caidllm serve --replicas N`: the same server as N Ray Serve replicas.

    pip install 'caidllm[ray]'
    caidllm serve --model tiny --replicas 2 --port 8000                  # a local Ray instance
    caidllm serve --model /models/LLaDA-8B-Instruct --replicas 8 --ray-address auto   # a running cluster

Each replica loads its own model and runs its own engine (one GPU each where
the cluster has GPUs); Ray Serve's HTTP proxy routes the requests among them.
The endpoints, streaming, limits and errors are those of `caidllm serve`
(serve/app.py is built inside every replica); `X-Caidllm-Replica` says which
replica answered. Ray Serve options go through unchanged with
`--ray-options '{"max_ongoing_requests": 16, "autoscaling_config":
{"min_replicas": 1, "max_replicas": 4}}'` (any `serve.deployment` option).
This file only reads the flags; serve/ray_deployment.py holds the Ray code
(serve/cli.py starts it).
"""

from __future__ import annotations

from caidllm.errors import InputError
from caidllm.options import json_object_option


def add_arguments(p) -> None:
    g = p.add_argument_group("replicas (Ray Serve; pip install 'caidllm[ray]')")
    g.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="serve N replicas, each its own model and engine, behind Ray Serve's proxy",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join ('auto', ray://host:10001); default: $RAY_ADDRESS, else a local "
        "Ray instance started here",
    )
    g.add_argument(
        "--ray-options",
        default=None,
        metavar="JSON",
        help="serve.deployment options passed to Ray as they are (max_ongoing_requests, "
        "autoscaling_config, request_router_config, ray_actor_options, ...)",
    )
    g.add_argument(
        "--replica-metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="replica k also serves its /metrics on PORT+k (on --host); /metrics through the proxy "
        "answers for whichever replica took the request",
    )


def wanted(args) -> bool:
    return getattr(args, "replicas", None) is not None


def deployment_options(args, gpus_in_cluster: bool) -> dict:
    """Ray Serve deployment options from the flags: N replicas, one GPU each where there are GPUs
    (one CPU each otherwise), then --ray-options on top."""
    if args.replicas < 1:
        raise InputError(f"--replicas must be at least 1, got {args.replicas}")
    options = {
        "num_replicas": args.replicas,
        "ray_actor_options": {"num_gpus": 1} if gpus_in_cluster else {"num_cpus": 1},
    }
    if args.ray_options:
        extra = json_object_option(args.ray_options, "--ray-options", "object of serve.deployment options")
        if "autoscaling_config" in extra:
            options.pop("num_replicas")  # Ray Serve takes one or the other
        options.update(extra)
    return options


def check(args) -> None:
    """What can be checked before Ray starts (a replica that fails to start makes Ray retry it)."""
    deployment_options(args, gpus_in_cluster=False)
    if getattr(args, "tp", 1) > 1:
        raise InputError(
            f"--tp {args.tp} with --replicas is not supported yet (each replica would have to spawn "
            "and own its ranks inside Ray); run one `caidllm serve --tp N` per machine, or --replicas "
            "without --tp"
        )
    if getattr(args, "tp_timeout", None) is not None:
        raise InputError("--tp-timeout applies to --tp N (N > 1) only; drop it or add --tp")
    if args.replica_metrics_port is not None and not 0 < args.replica_metrics_port < 65536:
        raise InputError(f"--replica-metrics-port must be a port number, got {args.replica_metrics_port}")
    for name in ("gen_length", "block_length", "max_batch", "max_queue"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    from caidllm.options import check_before_load

    check_before_load(args.model, args.method, gen_length=args.gen_length, block_length=args.block_length)
