"""`caidllm loadtest --soak`: a bounded soak and fault run against one caidllm server on loopback.

    caidllm serve --model tiny --max-batch 4 --max-queue 8 --port 8000 &
    caidllm loadtest --soak --url http://127.0.0.1:8000 --duration 600 --concurrency 6 --burst 20

First every request of a small pool (prompts x methods x chat/completion) is sent alone, one at a
time: its answer is the reference. Then C workers send mixed traffic until --duration seconds or
--requests requests: streamed and not, every method, clients that leave mid-answer, malformed
requests (--malformed-rate), and now and then a burst past the queue. At the end it checks:
no lost request (each one answered with its reference text, or refused with a 4xx / 429 / 503 /
504 OpenAI error body), no 5xx, the engine's requests back to 0, and the server's RSS growth after
the warm-up (the first fifth of the run).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

from caidllm.errors import InputError

CLEAN_REFUSALS = {400, 404, 405, 408, 413, 415, 429, 503, 504}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MALFORMED = [  # (method, path, body bytes, content type); each must get a 4xx OpenAI error body
    ("POST", "/v1/completions", b"{not json", "application/json"),
    ("POST", "/v1/completions", b'{"prompt": "hi \\ud800 there", "max_tokens": 8}', "application/json"),
    ("POST", "/v1/completions", b'{"prompt": "hi", "early_stop": "no"}', "application/json"),
    ("POST", "/v1/completions", b'{"prompt": "hi", "user": 5}', "application/json"),
    ("POST", "/v1/completions", b'{"prompt": "hi", "n": 3}', "application/json"),
    ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 1000000000}', "application/json"),
    ("POST", "/v1/completions", b"[]", "application/json"),
    ("POST", "/v1/chat/completions", b'{"messages": []}', "application/json"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}', "text/plain"),
    ("BREW", "/health", b"", "application/json"),
]


@dataclass
class SoakReport:
    sent: int = 0
    answered: int = 0  # 200 with the reference text
    refused: dict[str, int] = field(default_factory=dict)  # clean 4xx / 429 / 503 / 504, by status
    disconnects: int = 0  # clients that left on purpose
    server_errors: list[str] = field(default_factory=list)  # 5xx: must stay empty
    lost: list[str] = field(default_factory=list)  # no clean answer nor a clean refusal: must stay empty
    mismatches: list[str] = field(default_factory=list)  # 200 with another text than alone: must stay empty
    in_engine_after: float | None = None
    rss_mb: list[float] = field(default_factory=list)  # sampled through the run
    rss_growth_mb: float | None = None  # last sample minus the first after the warm-up
    wall_s: float = 0.0

    def ok(self, max_rss_growth_mb: float) -> bool:
        return (
            not self.server_errors
            and not self.lost
            and not self.mismatches
            and self.in_engine_after == 0
            and (self.rss_growth_mb is None or self.rss_growth_mb <= max_rss_growth_mb)
        )

    def summary(self) -> dict:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "refused": self.refused,
            "disconnects": self.disconnects,
            "server_errors": len(self.server_errors),
            "lost": len(self.lost),
            "mismatches": len(self.mismatches),
            "examples": (self.server_errors + self.lost + self.mismatches)[:5],
            "in_engine_after": self.in_engine_after,
            "rss_mb_first_last": self.rss_mb[:1] + self.rss_mb[-1:],
            "rss_growth_mb": self.rss_growth_mb,
            "wall_s": round(self.wall_s, 1),
        }

    def judge(self, status: int, payload, label: str, want: str | None) -> None:
        """Count one ending: the reference text, a clean refusal, a 5xx, a wrong text, or lost."""
        if status >= 500 and status not in (503, 504):
            self.server_errors.append(f"{label}: {status} {str(payload)[:200]}")
        elif status == 200 and want is not None:
            if payload != want:
                self.mismatches.append(f"{label}: {payload!r} != {want!r}")
            else:
                self.answered += 1
        elif (
            status in CLEAN_REFUSALS and isinstance(payload, dict) and payload.get("error", {}).get("message")
        ):
            self.refused[str(status)] = self.refused.get(str(status), 0) + 1
        else:
            self.lost.append(f"{label}: {status} {str(payload)[:200]}")


def _pool(
    prompts: list[str], methods: list[str], size: int, rng: random.Random, body: dict
) -> list[tuple[str, dict]]:
    """(path, request body) of the distinct requests the traffic is drawn from."""
    pool = []
    for i in range(size):
        prompt, method = prompts[i % len(prompts)], methods[i % len(methods)]
        own = _body_of(method, body)
        if rng.random() < 0.5:
            pool.append(
                (
                    "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": prompt}], "method": method, **own},
                )
            )
        else:
            pool.append(("/v1/completions", {"prompt": prompt, "method": method, **own}))
    return pool


def _body_of(method: str, body: dict) -> dict:
    """The shared body as `method` takes it: no block length for one that lays no blocks (Elastic-Cache's
    official loop refuses one other than gen_length; presets.lays_blocks: the body's cache and elastic_scope
    decide, as on the server; one it refuses is the server's to name)."""
    from caidllm.decode.presets import decodes_one_block

    whole = "block_length" in body and decodes_one_block(method, **body)
    return {k: v for k, v in body.items() if k != "block_length"} if whole else body


def _text(data: dict) -> str:
    choice = data["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@dataclass
class TrafficMix:
    """How often a soak request is malformed, leaves mid-answer, or comes as a burst (and how large)."""

    malformed_rate: float
    disconnect_rate: float
    burst_rate: float
    burst: int


async def run_soak(
    url: str,
    prompts: list[str],
    methods: list[str],
    *,
    duration: float,
    requests: int,
    concurrency: int,
    burst: int,
    seed: int = 0,
    pool_size: int = 16,
    body: dict | None = None,
    malformed_rate: float = 0.1,
    disconnect_rate: float = 0.1,
    burst_rate: float = 0.02,
    api_key: str | None = None,
) -> SoakReport:
    import httpx

    if urlparse(url).hostname not in LOOPBACK:
        raise InputError(f"the soak runs on loopback only (127.0.0.1, localhost, ::1), not {url}")
    rng, report = random.Random(seed), SoakReport()
    pool = _pool(prompts, methods, pool_size, rng, body or {"gen_length": 32, "block_length": 16})
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    mix = TrafficMix(malformed_rate, disconnect_rate, burst_rate, burst)
    async with httpx.AsyncClient(
        base_url=url,
        timeout=600,
        headers=headers,
        limits=httpx.Limits(max_connections=concurrency + burst + 8),
    ) as client:
        reference = await _references(client, pool)
        started = time.perf_counter()
        traffic = _Traffic(
            client, pool, reference, rng, report, mix, started + duration, iter(range(requests))
        )
        sampler = asyncio.ensure_future(_sample_rss(client, report, every=max(duration / 50, 0.5)))
        await asyncio.gather(*(traffic.worker() for _ in range(concurrency)))
        report.wall_s = time.perf_counter() - started
        sampler.cancel()
        report.in_engine_after = await _engine_drained(client)
        await _record_rss(client, report)
    if len(report.rss_mb) >= 3:  # growth after the warm-up: the first fifth of the samples
        report.rss_growth_mb = round(report.rss_mb[-1] - report.rss_mb[max(len(report.rss_mb) // 5, 1)], 1)
    return report


async def _references(client, pool: list[tuple[str, dict]]) -> list[str]:
    """Each pool request sent alone, one at a time: the text every later answer must match."""
    reference = []
    for path, request in pool:
        r = await client.post(path, json=request)
        if r.status_code != 200:
            raise InputError(f"the reference request {request} got {r.status_code}: {r.text[:300]}")
        reference.append(_text(r.json()))
    return reference


@dataclass
class _Traffic:
    """The mixed traffic of one soak: workers draw requests from the pool until the deadline or
    the request count, and the report judges each ending."""

    client: object
    pool: list[tuple[str, dict]]
    reference: list[str]
    rng: random.Random
    report: SoakReport
    mix: TrafficMix
    deadline: float
    counter: object  # one iterator shared by the workers: each request is sent once

    async def worker(self) -> None:
        rng, mix = self.rng, self.mix
        for _ in self.counter:
            if time.perf_counter() > self.deadline:
                return
            self.report.sent += 1
            roll = rng.random()
            if roll < mix.malformed_rate:
                await self.malformed()
            elif roll < mix.malformed_rate + mix.burst_rate:
                self.report.sent += mix.burst - 1
                await asyncio.gather(
                    *(
                        self.normal(rng.randrange(len(self.pool)), rng.random() < 0.5, None)
                        for _ in range(mix.burst)
                    )
                )
            else:
                leave = rng.uniform(0.05, 1.0) if rng.random() < mix.disconnect_rate else None
                await self.normal(rng.randrange(len(self.pool)), rng.random() < 0.5, leave)

    async def normal(self, i: int, stream: bool, leave_after: float | None) -> None:
        """Pool request i, streamed or not; with leave_after the client leaves mid-answer."""
        path, request = self.pool[i]
        label = f"{path} {request.get('method')} stream={stream}"
        judge = self.report.judge
        try:
            if stream:
                left = await _streamed(
                    self.client, path, request, label, self.reference[i], leave_after is not None, judge
                )
            else:
                call = self.client.post(path, json=request)
                r = await (call if leave_after is None else asyncio.wait_for(call, leave_after))
                judge(
                    r.status_code,
                    _text(r.json()) if r.status_code == 200 else _json(r),
                    label,
                    self.reference[i],
                )
                left = False
        except asyncio.TimeoutError:
            left = True  # the client left on purpose
        except Exception as error:  # noqa: BLE001 - a dropped connection or an unreadable answer is lost
            self.report.lost.append(f"{label}: {type(error).__name__}: {error}")
            left = False
        self.report.disconnects += left

    async def malformed(self) -> None:
        method, path, raw, content_type = self.rng.choice(MALFORMED)
        r = await self.client.request(method, path, content=raw, headers={"content-type": content_type})
        self.report.judge(r.status_code, _json(r), f"malformed {method} {path} {raw[:40]!r}", None)
        if r.status_code == 200:
            self.report.lost.append(f"malformed {raw[:40]!r} was accepted")


async def _sample_rss(client, report: SoakReport, every: float) -> None:
    while True:
        await _record_rss(client, report)
        await asyncio.sleep(every)


async def _record_rss(client, report: SoakReport) -> None:
    rss = await _metric(client, "process_resident_memory_bytes")
    if rss is not None:
        report.rss_mb.append(round(rss / 2**20, 1))


async def _engine_drained(client) -> float | None:
    """The engine's requests after the traffic; it empties within a step or two of the last request."""
    in_engine = None
    for _ in range(300):
        in_engine = await _metric(client, "caidllm_requests_in_engine")
        if in_engine == 0:
            break
        await asyncio.sleep(0.1)
    return in_engine


async def _streamed(client, path, request, label, want, leave: bool, judge) -> bool:
    """One streamed request, judged; whether the client left (after the first chunk, when `leave`)."""
    text, error = [], None
    async with client.stream("POST", path, json={**request, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            judge(r.status_code, _json(r), label, want)
            return False
        done = False
        async for line in r.aiter_lines():
            if leave:
                return True  # closing the response mid-body drops the connection
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk
                for choice in chunk.get("choices", []):
                    text.append(choice.get("delta", {}).get("content") or choice.get("text") or "")
    if error is not None:  # a clean error event (a timeout or shutdown): judged by its code
        judge({"timeout": 504}.get(error["error"].get("code"), 503), error, label, want)
    else:
        judge(200 if done else 0, "".join(text), label, want)
    return False


def _json(r):
    try:
        return r.json()
    except ValueError:
        return r.text


async def _metric(client, name: str) -> float | None:
    r = await client.get("/metrics")
    for line in r.text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def run(args) -> int:
    """The `--soak` mode of `caidllm loadtest` (serve/loadtest.py)."""
    from caidllm.bench.loadgen import synthetic_prompts
    from caidllm.decode.methods import method_names

    prompts = synthetic_prompts(8, args.seed)
    methods = args.method.split(",") if args.method else method_names()
    report = asyncio.run(
        run_soak(
            args.url.rstrip("/"),
            prompts,
            methods,
            duration=args.duration,
            requests=args.requests,
            concurrency=args.concurrency,
            burst=args.burst,
            seed=args.seed,
            malformed_rate=args.malformed_rate,
            api_key=args.api_key,
        )
    )
    summary = {**report.summary(), "ok": report.ok(args.max_rss_growth_mb)}
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["ok"] else 1
