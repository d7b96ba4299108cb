"""Compile time and per-step mask cost of the structured-generation libraries on the embedded tiny
tokenizer (docs/structured-output.md says why caidllm uses outlines-core). Run:
    python benchmarks/constraint_libraries.py
Each library compiles every schema of SCHEMAS (the median of 5 compiles) and then walks one valid answer
left to right, computing the next-token mask at each token (the only query xgrammar and llguidance answer;
caidllm's any-order sets need the automaton's states, which only outlines-core exposes)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from caidllm.bench.tasks.structured import SCHEMAS

TOKENIZER = Path(__file__).resolve().parents[1] / "src/caidllm/assets/tiny/tokenizer.json"


def _median(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def outlines_core_run(tokenizer, schema: dict, answer: list[int]) -> tuple[float, float]:
    from caidllm.decode.constraints.automaton import _build
    from caidllm.decode.constraints.spec import schema_regex

    # schema -> regex -> token automaton, uncached (caidllm keeps compiled automata: a repeat costs nothing)
    compile_s = _median(lambda: _build(tokenizer, schema_regex(schema), (0, 5), 2, "json_schema", 640))
    automaton = _build(tokenizer, schema_regex(schema), (0, 5), 2, "json_schema", 640)
    started, state = time.perf_counter(), automaton.initial
    for token in answer:
        automaton.allowed_after(state)
        state = automaton.next_state(state, token)
    return compile_s, (time.perf_counter() - started) / len(answer)


def llguidance_run(tokenizer, schema: dict, answer: list[int]) -> tuple[float, float]:
    import llguidance
    import llguidance.hf

    lltok = llguidance.hf.from_tokenizer(tokenizer)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    compile_s = _median(lambda: llguidance.LLMatcher(lltok, grammar))
    matcher = llguidance.LLMatcher(lltok, grammar)
    started = time.perf_counter()
    for token in answer:
        matcher.compute_logit_bias()
        matcher.consume_token(token)
    return compile_s, (time.perf_counter() - started) / len(answer)


def xgrammar_run(tokenizer, schema: dict, answer: list[int]) -> tuple[float, float]:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=640)
    compile_s = _median(
        lambda: xgrammar.GrammarCompiler(info, cache_enabled=False).compile_json_schema(json.dumps(schema))
    )
    matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(schema)))
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
    started = time.perf_counter()
    for token in answer:
        matcher.fill_next_token_bitmask(bitmask)
        matcher.accept_token(token)
    return compile_s, (time.perf_counter() - started) / len(answer)


def main() -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), eos_token="<|endoftext|>")
    print("| library | schema | compile ms | mask per token us |")
    print("|---|---|---:|---:|")
    for name, (schema, example) in SCHEMAS.items():
        answer = tokenizer.encode(json.dumps(example, separators=(",", ":")))
        for library, run in (
            ("outlines-core", outlines_core_run),
            ("llguidance", llguidance_run),
            ("xgrammar", xgrammar_run),
        ):
            try:
                compile_s, step_s = run(tokenizer, schema, answer)
                print(f"| {library} | {name} | {compile_s * 1e3:.2f} | {step_s * 1e6:.1f} |")
            except Exception as error:  # noqa: BLE001 - a library that cannot take a schema is a result too
                print(f"| {library} | {name} | failed: {type(error).__name__}: {str(error)[:60]} | |")


if __name__ == "__main__":
    main()
