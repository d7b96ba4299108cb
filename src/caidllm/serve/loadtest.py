"""`caidllm loadtest`: a bounded load on an OpenAI-compatible server.

    caidllm loadtest --url http://127.0.0.1:8000 --concurrency 8 --requests 64 --max-tokens 64
    caidllm loadtest --soak --url http://127.0.0.1:8000 --duration 600   # serve/soak.py

C workers send N streamed chat requests in all (prompts of the synthetic
tasks' test split, or --prompts FILE with one prompt per line), and stop by
themselves after N requests or --duration seconds, whichever comes first.
Reported: throughput (answer tokens/s from each response's usage), p50/p99
latency, p50/p99 time to first committed text, and errors by kind.
"""

from __future__ import annotations

import asyncio
import json

from caidllm.bench.loadgen import run_load, synthetic_prompts
from caidllm.errors import InputError
from caidllm.options import json_object_option


def register(sub, name: str) -> None:
    p = sub.add_parser(name, help="send a bounded load to a caidllm (or any OpenAI-compatible) server")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument(
        "--duration", type=float, default=300.0, help="stop starting requests after this many seconds"
    )
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--method", default=None, help="caidllm method (sent as an extension field)")
    p.add_argument("--extra", default="{}", help="more request fields, as a JSON object")
    p.add_argument("--prompts", default=None, help="file with one prompt per line (default: synthetic tasks)")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the summary to this file")
    soak = p.add_argument_group(
        "soak and fault run (--soak; serve/soak.py): mixed traffic checked to the end"
    )
    soak.add_argument(
        "--soak",
        action="store_true",
        help="mixed traffic (streamed or not, every method, clients "
        "that leave, malformed requests, bursts) checked against each request's answer alone",
    )
    soak.add_argument(
        "--burst", type=int, default=20, help="requests of a burst (make it pass the server's queue)"
    )
    soak.add_argument("--malformed-rate", type=float, default=0.1)
    soak.add_argument(
        "--max-rss-growth-mb", type=float, default=64.0, help="fail past this RSS growth after warm-up"
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    for name in ("concurrency", "requests"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.soak:
        from caidllm.serve import soak

        return soak.run(args)
    body = json_object_option(args.extra, "--extra", "object of request fields")
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    if args.method:
        body["method"] = args.method
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    else:
        prompts = synthetic_prompts(args.requests, args.seed)
    result = asyncio.run(
        run_load(
            args.url.rstrip("/"),
            prompts,
            args.concurrency,
            args.requests,
            duration=args.duration,
            body=body,
            api_key=args.api_key,
            stream=not args.no_stream,
        )
    )
    summary = result.summary()
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if not result.errors else 1
