"""The prefix store behind the server: a multi-turn chat and concurrent chats sharing a system prompt.

Two apps of `caidllm serve` (serve/app.py) on 127.0.0.1 in this process, one model loaded once: the store
off (--prefix-cache-mb 0) and on. Every request goes through the official openai client, streaming.

1. A chat of --turns turns, each sending the whole history (the answers so far included): time to the
   first committed text of each turn, off and on alternating turn by turn; the answers must be the same.
2. --concurrent chats at once, each a --system-tokens system prompt shared by all and its own question:
   wall time and requests per second, off then on then off then on (--rounds rounds), the answers the same.

    OMP_NUM_THREADS=1 python benchmarks/prefix_cache_chat.py --model tiny-bd --turns 4 --concurrent 32
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import openai

import caidllm
from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults

QUESTIONS = [
    "True and not False is",
    "not ( True or False ) is",
    "False or True and True is",
    "not not ( False ) is",
    "( True and False ) or True is",
    "not True or not False is",
]


def server(lm, args, budget: float) -> LocalServer:
    defaults = ServerDefaults(
        model_name="m",
        method=args.method,
        gen_length=args.gen_length,
        block_length=args.block_length,
        max_gen_length=args.gen_length,
    )
    return LocalServer(
        create_app(
            lm, ServerConfig(defaults=defaults, max_batch=args.batch, max_queue=256, prefix_cache_mb=budget)
        )
    )


async def ask(client, messages, args) -> tuple[str, float | None, float]:
    """(answer, seconds to its first text, seconds to its end) of one streamed chat request. An empty
    answer's first text is its end (tiny-bd, trained on single questions, often ends a later turn at once)."""
    started, first, text = time.perf_counter(), None, ""
    stream = await client.chat.completions.create(
        model="m", messages=messages, stream=True, max_tokens=args.gen_length
    )
    async for chunk in stream:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        ended = bool(chunk.choices and chunk.choices[0].finish_reason)
        if (delta or ended) and first is None:
            first = time.perf_counter() - started
        text += delta or ""
    return text, first, time.perf_counter() - started


def system_prompt(lm, tokens: int) -> str:
    words, text = "You are a careful assistant for boolean logic. Answer True or False, then stop.", ""
    while len(lm.tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text += words + " "
    return text.strip()


async def chat(clients, lm, args) -> list[tuple]:
    """Turn by turn, off then on: each turn's (ttft off, ttft on, same answer)."""
    histories = {name: [] for name in clients}
    rows = []
    for turn in range(args.turns):
        answers, ttft = {}, {}
        for name, client in clients.items():
            histories[name].append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            answers[name], ttft[name], _ = await ask(client, histories[name], args)
            histories[name].append({"role": "assistant", "content": answers[name] or "."})
        tokens = len(lm.encode_messages(histories["on"][:-1]))
        rows.append((turn + 1, tokens, ttft["off"], ttft["on"], answers["off"] == answers["on"]))
    return rows


async def concurrent(client, system: str, args) -> tuple[float, list[str]]:
    messages = [
        [{"role": "system", "content": system}, {"role": "user", "content": f"{QUESTIONS[i % 6]} ({i})"}]
        for i in range(args.concurrent)
    ]
    started = time.perf_counter()
    answers = await asyncio.gather(*(ask(client, m, args) for m in messages))
    return time.perf_counter() - started, [a[0] for a in answers]


async def main_async(lm, args) -> None:
    with server(lm, args, 0) as off, server(lm, args, args.prefix_cache_mb) as on:
        clients = {
            name: openai.AsyncOpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0, timeout=3600)
            for name, s in (("off", off), ("on", on))
        }
        for (
            client
        ) in clients.values():  # one unrelated request each first: nothing warms up inside the timings
            await ask(client, [{"role": "user", "content": "Warm up: False is"}], args)
        print(
            f"## {args.turns}-turn chat (method {args.method}, gen_length {args.gen_length}, block "
            f"{args.block_length})"
        )
        print(
            "| Turn | Prompt tokens | TTFT off (s) | TTFT on (s) | off / on | same answer "
            "|\n|---|---|---|---|---|---|"
        )
        for turn, tokens, a, b, same in await chat(clients, lm, args):
            print(f"| {turn} | {tokens} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {same} |")
        system = system_prompt(lm, args.system_tokens)
        n = len(lm.tokenizer.encode(system, add_special_tokens=False))
        print(
            f"\n## {args.concurrent} concurrent chats, a shared system prompt of about {n} tokens, batch "
            f"{args.batch}"
        )
        print("| Round | Store | Wall (s) | Requests/s |\n|---|---|---|---|")
        walls, outputs = {"off": [], "on": []}, {}
        for r in range(args.rounds):
            for name in ("off", "on"):
                wall, answers = await concurrent(clients[name], system, args)
                walls[name].append(wall)
                outputs.setdefault(name, answers)
                print(f"| {r + 1} | {name} | {wall:.2f} | {args.concurrent / wall:.2f} |")
        off_s, on_s = statistics.median(walls["off"]), statistics.median(walls["on"])
        print(
            f"\nmedian wall off {off_s:.2f} s, on {on_s:.2f} s: {off_s / on_s:.2f}x; "
            f"same answers: {outputs['off'] == outputs['on']}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-bd")
    p.add_argument("--device", default="cpu")
    p.add_argument("--method", default="llada2")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrent", type=int, default=32)
    p.add_argument("--system-tokens", type=int, default=500)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prefix-cache-mb", type=float, default=256)
    args = p.parse_args()
    lm = caidllm.load(args.model, device=args.device)
    asyncio.run(main_async(lm, args))


if __name__ == "__main__":
    main()
