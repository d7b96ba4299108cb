"""Nemotron-Labs-Diffusion's three decoders on a reduced random shape (CPU): ar, nemotron-dlm (block
diffusion, the chat script's threshold 0.9) and linear-spec (self-speculation, threshold 0), each over the
family's causal KV cache.

Every run decodes the same prompts (random token ids, greedy, early stop off, so every run decodes every
position); the runs alternate in order round after round (A B C ..., then ... C B A) and each figure is
the median of its rounds. Prints a Markdown table: forwards per generated token (the prefill included),
tokens per forward, linear-spec's mean accepted tokens per verify, wall time, the wall ratio against ar,
and whether the tokens equal ar's. The weights are random: the tokens mean nothing, and a random model's
draft is almost never the causal argmax, so linear-spec accepts about one token per verify here (a
trained checkpoint's acceptance is what makes it faster than ar); the costs per forward are the shape's.

    OMP_NUM_THREADS=1 python benchmarks/nemotron_modes.py --layers 4 --hidden 512 --vocab 32768 \
        --prompt-length 32 --gen-length 32 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import caidllm

HEADER = (
    "| method | block | forwards / token | tokens / forward | accepted / verify | wall s | wall / ar | = ar |"
)
RUNS = [
    ("ar", {}),
    ("nemotron-dlm", {"block_length": 32}),
    ("nemotron-dlm", {"block_length": 8}),
    ("linear-spec", {"block_length": 32}),
    ("linear-spec", {"block_length": 8}),
]


def model_name(args) -> str:
    fields = dict(
        num_hidden_layers=args.layers,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 7 // 2,
        num_attention_heads=args.hidden // 128,
        num_key_value_heads=max(1, args.hidden // 512),
        vocab_size=args.vocab,
    )
    return "random:nemotron-labs-diffusion-8b?" + "&".join(f"{k}={v}" for k, v in fields.items())


def run_once(lm, prompts, method, options, gen_length):
    started = time.perf_counter()
    results = lm.generate(prompts, method=method, gen_length=gen_length, early_stop=False, **options)
    return time.perf_counter() - started, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    lm = caidllm.load(model_name(args), device="cpu", dtype="float32")
    prompts = torch.randint(1000, args.vocab, (args.prompts, args.prompt_length)).tolist()
    walls = {i: [] for i in range(len(RUNS))}
    outputs = {}
    for r in range(args.rounds):
        order = range(len(RUNS)) if r % 2 == 0 else reversed(range(len(RUNS)))
        for i in order:
            method, options = RUNS[i]
            wall, outputs[i] = run_once(lm, prompts, method, options, args.gen_length)
            walls[i].append(wall)
    print(f"model {model_name(args)}; {args.prompts} prompts of {args.prompt_length}, gen {args.gen_length}")
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|")
    ar_wall, ar_tokens = statistics.median(walls[0]), [r.token_ids for r in outputs[0]]
    for i, (method, options) in enumerate(RUNS):
        results = outputs[i]
        tokens, forwards = sum(len(r.token_ids) for r in results), sum(r.nfe for r in results)
        accepted = [a for r in results for a in (r.accepted_lengths or [])]
        mean_accepted = f"{statistics.mean(accepted):.2f}" if accepted else "-"
        wall = statistics.median(walls[i])
        same = "yes" if [r.token_ids for r in results] == ar_tokens else "no"
        print(
            f"| {method} | {options.get('block_length', '-')} | {forwards / tokens:.3f} "
            f"| {tokens / forwards:.3f} | {mean_accepted} | {wall:.2f} | {wall / ar_wall:.2f} | {same} |"
        )


if __name__ == "__main__":
    main()
