"""Structured output on the embedded tiny model (BENCHMARKS.md, "Structured output"): 200 requests over the
ten schemas and five regexes of bench/tasks/structured.py, each with and without its constraint (alternating),
the share that parses and validates (jsonschema) or matches, NFE and wall time; then the automaton's share of
a step's time at gen length 256. Run: python benchmarks/structured_validity.py [--requests 200]"""

from __future__ import annotations

import argparse
import json
import re
import time

import jsonschema

import caidllm
from caidllm.bench.tasks.structured import REGEXES, SCHEMAS, regex_prompt, schema_prompt
from caidllm.decode.constraints import guide


def _cases(count: int) -> list[tuple[str, dict]]:
    """(prompt, generate keywords) cycling over schemas and regexes, sampled at temperature 0.7 with a seed
    each."""
    kinds = [("schema", name) for name in SCHEMAS] * 3 + [("regex", name) for name in REGEXES]
    cases = []
    for i in range(count):
        kind, name = kinds[i % len(kinds)]
        if kind == "schema":
            cases.append((schema_prompt(name), {"json_schema": SCHEMAS[name][0]}, ("schema", name)))
        else:
            cases.append((regex_prompt(name), {"regex": REGEXES[name][0]}, ("regex", name)))
    return cases


def _valid(text: str, case) -> bool:
    kind, name = case
    if kind == "regex":
        return re.fullmatch(REGEXES[name][0], text) is not None
    try:
        jsonschema.validate(json.loads(text), SCHEMAS[name][0])
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def validity(lm, count: int) -> dict:
    rows = {True: [0, 0, 0.0], False: [0, 0, 0.0]}  # constrained -> valid, nfe, seconds
    for i, (prompt, constraint, case) in enumerate(_cases(count)):
        for constrained in (True, False) if i % 2 else (False, True):  # alternating order
            options = {"method": "cai", "gen_length": 64, "block_length": 32, "temperature": 0.7, "seed": i}
            started = time.perf_counter()
            (r,) = lm.generate([prompt], **options, **(constraint if constrained else {}))
            row = rows[constrained]
            row[0] += _valid(r.text, case)
            row[1] += r.nfe
            row[2] += time.perf_counter() - started
    return {
        ("constrained" if k else "unconstrained"): {
            "valid": v[0] / count,
            "nfe": v[1] / count,
            "seconds": v[2] / count,
        }
        for k, v in rows.items()
    }


def automaton_share(lm, repeats: int = 4) -> dict:
    """The automaton's seconds (mask before prediction, commits settled after) against the whole step time."""
    spent = [0.0]

    def timed(function):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

        return run

    mask, settle = guide.mask_logits, guide.settle
    guide.mask_logits, guide.settle = timed(mask), timed(settle)
    try:
        total, steps = 0.0, 0
        for i in range(repeats):
            started = time.perf_counter()
            (r,) = lm.generate(
                [schema_prompt("numbers")],
                method="cai",
                gen_length=256,
                block_length=32,
                json_schema=SCHEMAS["numbers"][0],
                early_stop=False,
                seed=i,
            )
            total += time.perf_counter() - started
            steps += r.nfe
    finally:
        guide.mask_logits, guide.settle = mask, settle
    return {
        "steps": steps,
        "step_ms": 1e3 * total / steps,
        "automaton_ms": 1e3 * spent[0] / steps,
        "share": spent[0] / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    lm = caidllm.load("tiny")
    lm.generate(["warm up"], gen_length=32, block_length=32)
    print(json.dumps({"validity": validity(lm, args.requests), "gen256": automaton_share(lm)}, indent=1))


if __name__ == "__main__":
    main()
