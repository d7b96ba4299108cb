"""Offline batches against the server, over the same prompts, in one run.

    python -m caidllm.bench.serving --model tiny --requests 64 --concurrency 1,8,32

First `generate(batch_size=8)` on every prompt in this process (after a
warm-up batch): answer tokens/s. Then `caidllm serve` is started as a
subprocess on a free 127.0.0.1 port with the same model and settings, and
`caidllm loadtest`'s client sends the same prompts (streamed chat requests)
at each concurrency. The server subprocess and this client share the
machine's cores; nothing else should run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import httpx

import caidllm
from caidllm.bench.arrivals import markdown_table, write_json
from caidllm.bench.loadgen import run_load, synthetic_prompts
from caidllm.decode.presets import lays_blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline(lm, prompts, args) -> dict:
    settings = dict(
        method=args.method, gen_length=args.gen_length, block_length=args.block_length, batch_size=8
    )
    lm.generate(prompts[:8], **settings)  # warm-up
    started = time.perf_counter()
    results = lm.generate(prompts, **settings)
    wall = time.perf_counter() - started
    return {
        "setting": "offline generate(batch_size=8)",
        "throughput_tok_s": sum(r.answer_length for r in results) / wall,
        "wall_s": wall,
        "texts": [r.text for r in results],
    }


def start_server(args, port: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "caidllm.cli",
        "serve",
        "--model",
        args.model,
        "--port",
        str(port),
        "--method",
        args.method,
        "--gen-length",
        str(args.gen_length),
        *(["--block-length", str(args.block_length)] if args.block_length else []),
        "--max-batch",
        "8",
        "--max-queue",
        "256",
        "--log-level",
        "warning",
    ]
    if args.device:
        cmd += ["--device", args.device]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the server did not come up")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.block_length is None and lays_blocks(args.method):
        args.block_length = 32
    prompts = synthetic_prompts(args.requests, args.seed)
    lm = caidllm.load(args.model, device=args.device)
    rows = [offline(lm, prompts, args)]
    want = rows[0].pop("texts")
    del lm
    rows += served_rows(args, prompts, want)
    print(rows_table(rows, len(prompts)))
    write_json(args.json, {"settings": vars(args), "rows": rows})
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m caidllm.bench.serving", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--method", default="cai")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="default 32, none to a method that lays no blocks (Elastic-Cache's official loop)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None)
    return ap


def served_rows(args, prompts: list, want: list) -> list[dict]:
    """One row per --concurrency level against a `caidllm serve` subprocess (after a warm-up), each
    counting the answers whose text equals the offline run's."""
    rows = []
    port = free_port()
    proc = start_server(args, port)
    try:
        body = {
            "gen_length": args.gen_length,
            **({"block_length": args.block_length} if args.block_length else {}),
        }
        url = f"http://127.0.0.1:{port}"
        asyncio.run(run_load(url, prompts[:8], 8, 8, body=body))  # warm-up
        for c in (int(x) for x in args.concurrency.split(",")):
            result = asyncio.run(run_load(url, prompts, c, len(prompts), body=body, duration=1800))
            same = sum(result.texts.get(i) == t for i, t in enumerate(want))
            rows.append({"setting": f"server, concurrency {c}", **result.summary(), "same_text": same})
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)
    return rows


def rows_table(rows: list[dict], n_prompts: int) -> str:
    base = rows[0]["throughput_tok_s"]

    def f(r, key):
        return "" if r.get(key) is None else f"{r[key]:.2f}"

    return markdown_table(
        [
            "setting",
            "answer tok/s",
            "vs offline",
            "p50 latency s",
            "p99 latency s",
            "p50 TTFT s",
            "p99 TTFT s",
            "errors",
            "same text",
        ],
        [
            [
                r["setting"],
                f"{r['throughput_tok_s']:.1f}",
                f"{r['throughput_tok_s'] / base:.2f}x",
                *(f(r, k) for k in ("latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s")),
                sum(r.get("errors", {}).values()),
                f"{r.get('same_text', n_prompts)}/{n_prompts}",
            ]
            for r in rows
        ],
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
