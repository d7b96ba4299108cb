"""Continuous batching against static batches, under requests arriving over time.

    python -m caidllm.bench.arrivals --model tiny --requests 64 --methods cai,vanilla

The same requests (prompts of the synthetic tasks' test split) arrive at the
same seeded Poisson times, at a rate near the engine's capacity (--load times
the requests/s that offline batches of --max-batch reach, measured first).
Two ways to serve them, in one run:
- continuous: one Engine; each request is submitted when it arrives and joins
  the running batch at the next step; a finished one leaves at once.
- static: wait until --max-batch requests have arrived (or no more will), then
  decode them as one batch to the end (generate()'s loop, run through the
  same engine so commit times are seen); arrivals meanwhile wait for the next.
Per request: latency (arrival to last token), time to first committed token
(arrival to the first step that commits a position), and answer tokens;
throughput is answer tokens over the span from the first arrival to the last
finish. Timings are wall clock on this machine: compare the two columns of one
run, never figures across machines.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass

import caidllm
from caidllm.bench.loadgen import percentile, synthetic_prompts  # noqa: F401 - also read from here
from caidllm.decode import build_config
from caidllm.decode.engine import Engine
from caidllm.decode.presets import run_lengths


@dataclass
class Served:
    arrival: float
    first_commit: float
    finish: float
    answer_tokens: int


def prompts_of(lm, n: int, seed: int) -> list[list[int]]:
    """n chat-encoded synthetic prompts."""
    return [lm.encode_chat(p) for p in synthetic_prompts(n, seed)]


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    return times


def serve_continuous(lm, prompts, arrivals, config, max_batch: int) -> list[Served]:
    engine = Engine(lm, max_batch=max_batch, max_queue=len(prompts))
    served, first, ids = {}, {}, {}
    start, nxt = time.perf_counter(), 0
    while nxt < len(prompts) or engine.has_work:
        now = time.perf_counter() - start
        while nxt < len(prompts) and arrivals[nxt] <= now:
            ids[engine.submit(prompts[nxt], config)] = nxt
            nxt += 1
        if not engine.has_work:
            time.sleep(max(0.0, arrivals[nxt] - (time.perf_counter() - start)))
            continue
        for e in engine.step():
            _note(e, ids[e.request_id], arrivals, start, first, served)
    return [served[i] for i in range(len(prompts))]


def _note(e, i: int, arrivals, start: float, first: dict, served: dict) -> None:
    """Request i's first commit and its end, from its events."""
    if e.positions and i not in first:
        first[i] = e.at - start
    if e.finished:
        served[i] = Served(arrivals[i], first[i], e.at - start, e.result.answer_length)


def serve_static(lm, prompts, arrivals, config, max_batch: int) -> list[Served]:
    served, start, nxt = {}, time.perf_counter(), 0
    while nxt < len(prompts):
        batch = list(range(nxt, min(nxt + max_batch, len(prompts))))
        time.sleep(max(0.0, arrivals[batch[-1]] - (time.perf_counter() - start)))  # wait for a full batch
        engine = Engine(lm, max_batch=max_batch)
        ids = {engine.submit(prompts[i], config): i for i in batch}
        first = {}
        for e in engine.run():
            _note(e, ids[e.request_id], arrivals, start, first, served)
        nxt = batch[-1] + 1
    return [served[i] for i in range(len(prompts))]


def summary(served: list[Served]) -> dict:
    latency = sorted(s.finish - s.arrival for s in served)
    ttft = sorted(s.first_commit - s.arrival for s in served)
    span = max(s.finish for s in served) - min(s.arrival for s in served)
    return {
        "throughput_tok_s": sum(s.answer_tokens for s in served) / span,
        "latency_mean_s": sum(latency) / len(latency),
        "latency_p99_s": percentile(latency, 99),
        "ttft_mean_s": sum(ttft) / len(ttft),
        "ttft_p99_s": percentile(ttft, 99),
    }


def capacity(lm, prompts, config, max_batch: int) -> float:
    """Requests per second of offline batches of max_batch (after one warm-up batch)."""
    lm.generate(
        prompts[:max_batch], method=config.method, batch_size=max_batch, chat=False, **_settings(config)
    )
    sample = prompts[: 2 * max_batch]
    started = time.perf_counter()
    lm.generate(sample, method=config.method, batch_size=max_batch, chat=False, **_settings(config))
    return len(sample) / (time.perf_counter() - started)


def _settings(config) -> dict:
    return dict(gen_length=config.gen_length, block_length=config.block_length, early_stop=config.early_stop)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    lm = caidllm.load(args.model, device=args.device)
    rows = measure(lm, args)
    print(rows_table(rows))
    write_json(args.json, {"settings": vars(args), "rows": rows})
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m caidllm.bench.arrivals", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--methods", default="cai,vanilla")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument(
        "--block-length", type=int, default=None, help="the block-wise methods' block (default 32)"
    )
    ap.add_argument(
        "--load", type=float, default=0.9, help="arrival rate as a share of the measured capacity"
    )
    ap.add_argument("--rate", type=float, default=None, help="arrivals per second (instead of --load)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    return ap


def measure(lm, args) -> list[dict]:
    """One row per method and serving mode (continuous, static), each under the same Poisson arrivals."""
    prompts = prompts_of(lm, args.requests, args.seed)
    rows = []
    methods = args.methods.split(",")
    # The block length goes to the methods that lay blocks (presets.run_lengths); the default is not given.
    for method, lengths in zip(
        methods, run_lengths([(m, {}) for m in methods], args.gen_length, args.block_length)
    ):
        unset = lengths["block_length"] is None  # a --block-length 0 given is refused, not replaced
        config = build_config(
            method,
            gen_length=args.gen_length,
            block_length=32 if unset else lengths["block_length"],
            filled=("block_length",) if unset else (),
        )
        rate = args.rate or args.load * capacity(lm, prompts, config, args.max_batch)
        arrivals = poisson_arrivals(args.requests, rate, args.seed)
        for name, serve in (("continuous", serve_continuous), ("static", serve_static)):
            rows.append(
                {
                    "method": method,
                    "serving": name,
                    "rate_req_s": rate,
                    **summary(serve(lm, prompts, arrivals, config, args.max_batch)),
                }
            )
    return rows


def rows_table(rows: list[dict]) -> str:
    return markdown_table(
        [
            "method",
            "serving",
            "arrivals/s",
            "answer tok/s",
            "mean latency s",
            "p99 latency s",
            "mean TTFT s",
            "p99 TTFT s",
        ],
        [
            [
                r["method"],
                r["serving"],
                f"{r['rate_req_s']:.2f}",
                f"{r['throughput_tok_s']:.1f}",
                *(f"{r[k]:.2f}" for k in ("latency_mean_s", "latency_p99_s", "ttft_mean_s", "ttft_p99_s")),
            ]
            for r in rows
        ],
    )


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def write_json(path: str | None, obj) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
