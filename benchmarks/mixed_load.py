"""A light request beside heavy ones: the engine's step policies side by side (BENCHMARKS.md).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/mixed_load.py --rounds 2 --out /tmp/mixed.json

On `tiny`: 4 heavy requests (vanilla, no cache, 512 tokens: one full forward of 4 rows a step)
decode while light requests (cai, 32 tokens: 6 forwards) arrive one every --interval seconds
(each at a seeded random phase of the heavy forward in progress). Per step policy, alternating
within one run: the light request's latency alone and beside the heavy ones (submit to last
token), its streamed time to first committed text (submit to the first event with text a
stream can show), the heavy rows' throughput (row steps per second) alone and while the light
requests arrive, and the share of engine steps in which each kind ran during a light request's
life. Requests go through a BackgroundEngine, as the server's do.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time

import caidllm
from caidllm.decode import build_config, scheduler
from caidllm.decode.background import BackgroundEngine
from caidllm.decode.engine import Engine

LIGHT = dict(method="cai", gen_length=32, block_length=32)  # 6 forwards on tiny for the prompt below
# --light-methods: a light request of each method as the server makes one for `max_tokens: 64` at its
# default block length (64, the heavy rows' too: the rows could share a forward)
LIGHT_OF = dict(gen_length=64, block_length=64)
LIGHT_PROMPT = "not not not ( False ) or True is"
HEAVY = dict(method="vanilla", gen_length=512, block_length=64, early_stop=False)


class Recorder:
    """Which requests each engine step advanced, and when it ended (wraps Engine.step)."""

    def __init__(self, engine: Engine):
        self.steps: list[tuple[float, set[str]]] = []
        inner = engine.step

        def step():
            events = inner()
            self.steps.append((time.perf_counter(), {e.request_id for e in events}))
            return events

        engine.step = step


def light_once(background, prompt, config) -> dict:
    started = time.perf_counter()
    handle = background.submit(prompt, config)
    first_text = None
    for event in handle:
        if first_text is None and event.prefix_length > 0:
            first_text = event.at - started
    return dict(
        id=handle.id,
        start=started,
        latency=time.perf_counter() - started,
        first_text=first_text,
        nfe=handle.result.nfe,
        tokens=handle.result.token_ids,
    )


def heavy_rate(recorder: Recorder, heavy_ids: set[str], since: float, until: float) -> float:
    """Heavy rows advanced per second, from the end of the first heavy step in the window to the end
    of the last (whole steps only)."""
    ends = [
        (at, len(ids & heavy_ids)) for at, ids in recorder.steps if since <= at <= until and ids & heavy_ids
    ]
    if len(ends) < 2:
        return float("nan")
    return sum(rows for _, rows in ends[1:]) / (ends[-1][0] - ends[0][0])


def one_policy(lm, policy: str, args, light_prompt, heavy_prompts, rng, light_method=None) -> dict:
    """`policy`, or `policy:shared-width`: the scheduler's grouping before width classes (issue 49), rows of
    any canvas size sharing a forward."""
    step_policy, _, variant = policy.partition(":")
    saved = scheduler.width_class
    if variant == "shared-width":
        scheduler.width_class = lambda request: 0
    try:
        return _one_policy(lm, step_policy, args, light_prompt, heavy_prompts, rng, light_method) | {
            "policy": policy
        }
    finally:
        scheduler.width_class = saved


def _one_policy(lm, policy: str, args, light_prompt, heavy_prompts, rng, light_method=None) -> dict:
    light = build_config(**(LIGHT if light_method is None else dict(method=light_method, **LIGHT_OF)))
    heavy = build_config(**HEAVY)
    engine = Engine(lm, max_batch=8, step_policy=policy)
    recorder = Recorder(engine)
    background = BackgroundEngine(engine).start()
    try:
        alone = [light_once(background, light_prompt, light) for _ in range(3)]
        # One light request at a time beside the heavy ones: a light request of several seconds (vanilla's
        # 64 steps) arriving every 2 s would meet the light ones before it as well.
        interval = max(args.interval, 3 * statistics.median(a["latency"] for a in alone))
        handles = [background.submit(p, heavy) for p in heavy_prompts]
        heavy_ids = {h.id for h in handles}
        while not any(ids & heavy_ids for _, ids in recorder.steps):
            time.sleep(0.01)
        t0 = time.perf_counter()
        time.sleep(args.heavy_window)
        rate_alone = heavy_rate(recorder, heavy_ids, t0, time.perf_counter())
        beside, threads = [], []
        lights_from = time.perf_counter()
        for i in range(args.lights):
            time.sleep(max(0.0, lights_from + i * interval + rng.uniform(0, 1.0) - time.perf_counter()))
            thread = threading.Thread(
                target=lambda: beside.append(light_once(background, light_prompt, light))
            )
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        lights_until = max(b["start"] + b["latency"] for b in beside)
        rate_beside = heavy_rate(recorder, heavy_ids, lights_from, lights_until)
        shares = step_shares(recorder, beside, heavy_ids)
    finally:
        background.stop(timeout=30)
    assert all(b["tokens"] == alone[0]["tokens"] for b in alone + beside), "a light request's tokens changed"
    alone_s = statistics.median(a["latency"] for a in alone)
    return dict(
        policy=policy,
        light_method=light_method or LIGHT["method"],
        light_nfe=alone[0]["nfe"],
        light_alone_s=alone_s,
        light_beside_s=statistics.median(b["latency"] for b in beside),
        light_beside_max_s=max(b["latency"] for b in beside),
        first_text_alone_s=statistics.median(a["first_text"] for a in alone),
        first_text_beside_s=statistics.median(b["first_text"] for b in beside),
        heavy_rows_per_s_alone=rate_alone,
        heavy_rows_per_s_beside=rate_beside,
        **shares,
    )


def step_shares(recorder: Recorder, lights: list[dict], heavy_ids: set[str]) -> dict:
    """Over each light request's life: the share of engine steps that advanced it, and heavy rows."""
    light_share, heavy_share, waits = [], [], []
    for b in lights:
        steps = [ids for at, ids in recorder.steps if b["start"] < at <= b["start"] + b["latency"]]
        light_share.append(sum(b["id"] in ids for ids in steps) / len(steps))
        heavy_share.append(sum(bool(ids & heavy_ids) for ids in steps) / len(steps))
        # The wait for the forward in progress at its arrival (a step is not preempted): until the end
        # of the step before its first one.
        ends = [at for at, ids in recorder.steps]
        first = next(i for i, (at, ids) in enumerate(recorder.steps) if b["id"] in ids)
        waits.append(max(0.0, ends[first - 1] - b["start"]) if first else 0.0)
    return dict(
        light_step_share=statistics.mean(light_share),
        heavy_step_share=statistics.mean(heavy_share),
        light_wait_for_running_forward_s=statistics.median(waits),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds (policies alternate within each)")
    parser.add_argument("--lights", type=int, default=6, help="light requests per round and policy")
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="seconds between light arrivals (at least 3x a light request's time alone)",
    )
    parser.add_argument("--heavy-window", type=float, default=8.0, help="seconds the heavy rows run alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default="all,fair", help="step policies, alternating within each round")
    parser.add_argument(
        "--light-methods",
        default=None,
        help="comma-separated methods of the light request (64 tokens, block 64), one after another "
        "in each round; default: cai with 32 tokens in one block",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lm = caidllm.load("tiny", device="cpu", dtype="float32")
    light_prompt = lm.encode_chat(LIGHT_PROMPT)
    heavy_prompts = [lm.encode_chat(f"{i} + {i} * 2 =") for i in range(4)]
    rng = random.Random(args.seed)
    policies = args.policies.split(",")
    methods = args.light_methods.split(",") if args.light_methods else [None]
    runs = []
    for r in range(args.rounds):
        for policy in policies if r % 2 == 0 else policies[::-1]:
            for method in methods if r % 2 == 0 else methods[::-1]:
                runs.append(
                    dict(round=r, **one_policy(lm, policy, args, light_prompt, heavy_prompts, rng, method))
                )
                print(json.dumps(runs[-1]), file=sys.stderr)
    summary = {}
    for key in sorted({(x["policy"], x["light_method"]) for x in runs}):
        mine = [x for x in runs if (x["policy"], x["light_method"]) == key]
        pick = {k: statistics.median(x[k] for x in mine) for k in mine[0] if isinstance(mine[0][k], float)}
        pick["light_slowdown"] = pick["light_beside_s"] / pick["light_alone_s"]
        pick["heavy_throughput_drop"] = 1 - pick["heavy_rows_per_s_beside"] / pick["heavy_rows_per_s_alone"]
        summary["/".join(key)] = pick
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": runs, "summary": summary, "args": vars(args)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
