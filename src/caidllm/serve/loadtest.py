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
import time
from dataclasses import dataclass, field

from caidllm.errors import InputError
from caidllm.options import json_object_option


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)  # prompt index -> answer text
    wall_s: float = 0.0

    def summary(self) -> dict:
        from caidllm.bench.arrivals import percentile

        lat, ttft = sorted(self.latencies), sorted(self.ttfts)
        return {
            "requests_ok": len(lat), "errors": dict(self.errors), "wall_s": self.wall_s,
            "throughput_tok_s": self.tokens / self.wall_s if self.wall_s else 0.0,
            "latency_p50_s": percentile(lat, 50) if lat else None, "latency_p99_s": percentile(lat, 99) if lat else None,
            "ttft_p50_s": percentile(ttft, 50) if ttft else None, "ttft_p99_s": percentile(ttft, 99) if ttft else None,
        }


async def run_load(url: str, prompts: list[str], concurrency: int, requests: int, *, duration: float = 300.0,
                   body: dict | None = None, api_key: str | None = None, stream: bool = True,
                   timeout: float = 600.0) -> LoadResult:
    """Send `requests` chat requests through `concurrency` workers; returns what came back."""
    import httpx

    result, started = LoadResult(), time.perf_counter()
    deadline = started + duration
    counter = iter(range(requests))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def one(client, i: int) -> None:
        payload = {"messages": [{"role": "user", "content": prompts[i % len(prompts)]}], **(body or {})}
        if stream:
            payload.update(stream=True, stream_options={"include_usage": True})
        sent = time.perf_counter()
        text, first, usage = [], None, None
        try:
            if not stream:
                r = await client.post(f"{url}/v1/chat/completions", json=payload, headers=headers)
                if r.status_code != 200:
                    raise _Http(r.status_code)
                data = r.json()
                text.append(data["choices"][0]["message"]["content"])
                first, usage = time.perf_counter(), data["usage"]
            else:
                async with client.stream("POST", f"{url}/v1/chat/completions", json=payload, headers=headers) as r:
                    if r.status_code != 200:
                        raise _Http(r.status_code)
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            raise _Http(chunk["error"].get("code") or "stream_error")
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                        for choice in chunk.get("choices", []):
                            piece = choice.get("delta", {}).get("content")
                            if piece:
                                first = first or time.perf_counter()
                                text.append(piece)
        except Exception as error:  # noqa: BLE001 - every failure is counted by kind
            kind = f"http_{error.status}" if isinstance(error, _Http) else type(error).__name__
            result.errors[kind] = result.errors.get(kind, 0) + 1
            return
        done = time.perf_counter()
        result.latencies.append(done - sent)
        result.ttfts.append((first or done) - sent)
        result.tokens += (usage or {}).get("completion_tokens", 0)
        result.texts[i] = "".join(text)

    async def worker(client) -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                return
            await one(client, i)

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - started
    return result


class _Http(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


def register(sub, name: str) -> None:
    p = sub.add_parser(name, help="send a bounded load to a caidllm (or any OpenAI-compatible) server")
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--duration", type=float, default=300.0, help="stop starting requests after this many seconds")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--method", default=None, help="caidllm method (sent as an extension field)")
    p.add_argument("--extra", default="{}", help="more request fields, as a JSON object")
    p.add_argument("--prompts", default=None, help="file with one prompt per line (default: synthetic tasks)")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the summary to this file")
    soak = p.add_argument_group("soak and fault run (--soak; serve/soak.py): mixed traffic checked to the end")
    soak.add_argument("--soak", action="store_true", help="mixed traffic (streamed or not, every method, clients "
                      "that leave, malformed requests, bursts) checked against each request's answer alone")
    soak.add_argument("--burst", type=int, default=20, help="requests of a burst (make it pass the server's queue)")
    soak.add_argument("--malformed-rate", type=float, default=0.1)
    soak.add_argument("--max-rss-growth-mb", type=float, default=64.0, help="fail past this RSS growth after warm-up")
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
        from caidllm.bench.arrivals import synthetic_prompts

        prompts = synthetic_prompts(args.requests, args.seed)
    result = asyncio.run(run_load(args.url.rstrip("/"), prompts, args.concurrency, args.requests,
                                  duration=args.duration, body=body, api_key=args.api_key, stream=not args.no_stream))
    summary = result.summary()
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if not result.errors else 1
