"""Load generation shared by `caidllm loadtest` (serve/loadtest.py), the serving
benchmark (bench/serving.py) and the arrivals benchmark (bench/arrivals.py):
synthetic prompts, percentiles, and the client that sends a bounded load of
streamed chat requests to an OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

from caidllm.tasks import get_task

TASKS = ("boolean_expressions", "arithmetic", "web_of_lies", "navigate")


def synthetic_prompts(n: int, seed: int) -> list[str]:
    """n prompts drawn evenly from the synthetic tasks' test split, shuffled."""
    per_task = -(-n // len(TASKS))
    examples = [ex for name in TASKS for ex in get_task(name).examples("test", per_task, seed=seed)]
    random.Random(seed).shuffle(examples)
    return [ex.prompt for ex in examples[:n]]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)  # prompt index -> answer text
    wall_s: float = 0.0

    def summary(self) -> dict:
        lat, ttft = sorted(self.latencies), sorted(self.ttfts)
        return {
            "requests_ok": len(lat),
            "errors": dict(self.errors),
            "wall_s": self.wall_s,
            "throughput_tok_s": self.tokens / self.wall_s if self.wall_s else 0.0,
            "latency_p50_s": percentile(lat, 50) if lat else None,
            "latency_p99_s": percentile(lat, 99) if lat else None,
            "ttft_p50_s": percentile(ttft, 50) if ttft else None,
            "ttft_p99_s": percentile(ttft, 99) if ttft else None,
        }

    def record(self, i: int, sent: float, answer: _Answer) -> None:
        done = time.perf_counter()
        self.latencies.append(done - sent)
        self.ttfts.append((answer.first or done) - sent)  # no text at all: the first token came at the end
        self.tokens += (answer.usage or {}).get("completion_tokens", 0)
        self.texts[i] = "".join(answer.text)

    def record_error(self, error: Exception) -> None:
        kind = f"http_{error.status}" if isinstance(error, _Http) else type(error).__name__
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def run_load(
    url: str,
    prompts: list[str],
    concurrency: int,
    requests: int,
    *,
    duration: float = 300.0,
    body: dict | None = None,
    api_key: str | None = None,
    stream: bool = True,
    timeout: float = 600.0,
) -> LoadResult:
    """Send `requests` chat requests through `concurrency` workers; returns what came back."""
    import httpx

    result, started = LoadResult(), time.perf_counter()
    deadline = started + duration
    counter = iter(range(requests))  # shared by the workers: each request is sent once
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    receive = _streamed_answer if stream else _whole_answer

    async def worker(client) -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                return
            payload = _chat_payload(prompts[i % len(prompts)], body, stream)
            sent = time.perf_counter()
            try:
                answer = await receive(client, f"{url}/v1/chat/completions", payload, headers)
            except Exception as error:  # noqa: BLE001 - every failure is counted by kind
                result.record_error(error)
                continue
            result.record(i, sent, answer)

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - started
    return result


def _chat_payload(prompt: str, body: dict | None, stream: bool) -> dict:
    payload = {"messages": [{"role": "user", "content": prompt}], **(body or {})}
    if stream:
        payload.update(stream=True, stream_options={"include_usage": True})
    return payload


@dataclass
class _Answer:
    """What came back for one request: its text pieces, when the first arrived, the usage block."""

    text: list[str] = field(default_factory=list)
    first: float | None = None
    usage: dict | None = None


async def _whole_answer(client, url: str, payload: dict, headers: dict) -> _Answer:
    r = await client.post(url, json=payload, headers=headers)
    if r.status_code != 200:
        raise _Http(r.status_code)
    data = r.json()
    return _Answer([data["choices"][0]["message"]["content"]], time.perf_counter(), data["usage"])


async def _streamed_answer(client, url: str, payload: dict, headers: dict) -> _Answer:
    answer = _Answer()
    async with client.stream("POST", url, json=payload, headers=headers) as r:
        if r.status_code != 200:
            raise _Http(r.status_code)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:  # a clean error event mid-stream (a timeout, a shutdown)
                raise _Http(chunk["error"].get("code") or "stream_error")
            if chunk.get("usage"):
                answer.usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    answer.first = answer.first or time.perf_counter()
                    answer.text.append(piece)
    return answer


class _Http(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status
