"""Outputs of every method preset recorded from the closed-loop `run_batch`
(commit 91a1fd3), before `generate()` became a client of the step-level
engine. test_engine_regression.py checks that today's code gives the same.

Re-record (only when a change is meant to alter outputs, and say why):
    python tests/engine_regression.py
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import caidllm
from caidllm.decode import build_config, method_names
from caidllm.decode.engine import family_refusal
from caidllm.decode.presets import lays_blocks
from caidllm.errors import InputError
from helpers.checkpoints import write_random_checkpoint

RECORD = Path(__file__).parent / "data" / "engine_regression.json"
RANDOM_PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [23, 24, 25, 26]]
TINY_PROMPTS = ["not ( True ) and ( True ) is", "True and not False or ( False ) is", "7 + 5 * 3 ="]

# (case name, model, prompts, generate() keywords); every preset runs each case.
# Recorded one prompt at a time (batch_size=1): the old static batch padded the shorter
# prompts, which moved their confidences in the last bits (SDPA sums keys in blocks counted
# from the first column, so padding shifts them); alone, they are what the engine now gives
# a request in any batch (tests/test_engine_batching.py checks that).
CASES = [
    ("llada", "llada", RANDOM_PROMPTS, dict(gen_length=16, block_length=8, early_stop=False, batch_size=1)),
    (
        "llada-low-threshold",
        "llada",
        RANDOM_PROMPTS,
        dict(gen_length=16, block_length=8, early_stop=False, threshold=0.2, batch_size=1),
    ),
    ("dream", "dream", RANDOM_PROMPTS, dict(gen_length=16, block_length=8, early_stop=False, batch_size=1)),
    ("tiny", "tiny", TINY_PROMPTS, dict(gen_length=64, block_length=16, batch_size=1)),
]
SAMPLING_CASE = (
    "llada-sampled",
    "llada",
    RANDOM_PROMPTS,
    dict(
        method="fastdllm",
        gen_length=16,
        block_length=8,
        early_stop=False,
        temperature=1.0,
        seed=7,
        batch_size=1,
    ),
)


def load_models(folder: Path) -> dict:
    return {
        "tiny": caidllm.load("tiny", device="cpu", dtype="float32"),
        "llada": caidllm.load(
            write_random_checkpoint(folder / "llada", "llada"), device="cpu", dtype="float32"
        ),
        "dream": caidllm.load(
            write_random_checkpoint(folder / "dream", "dream"), device="cpu", dtype="float32"
        ),
    }


# Exact on any machine: what the decoder chose. Floats (confidences, the share of work an early-skipping
# forward ran) move in their last bits with the CPU's matrix-multiply kernels (MKL / oneDNN pick them by
# CPU and batch shape), so they are compared to FLOAT_RELATIVE_TOLERANCE: 1e-4, as 1e-5 is not enough (the
# 2-core AMD EPYC of 2026-12-01 gives tiny/vanilla prompt 2 position 25 a confidence of 0.3137059 where the
# record has 0.3137019, 1.3e-5 apart, with every token the same).
EXACT_FIELDS = (
    "token_ids",
    "text",
    "answer_length",
    "nfe",
    "steps_per_block",
    "early_stopped",
    "commit_step",
    "commit_step_in_block",
)
FLOAT_FIELDS = ("first_confidence", "computed_fraction")
FLOAT_RELATIVE_TOLERANCE = 1e-4


def differences(want: dict, got: dict) -> list[str]:
    """The fields of one recorded output that `got` does not match (exact or to the tolerance)."""
    assert set(want) == set(EXACT_FIELDS + FLOAT_FIELDS), (
        "the record's fields changed: update the lists above"
    )
    wrong = [key for key in EXACT_FIELDS if got[key] != want[key]]
    return wrong + [key for key in FLOAT_FIELDS if not floats_match(want[key], got[key])]


def floats_match(want, got) -> bool:
    """A float or a list of floats (None and NaN where nothing was measured) to the tolerance."""
    if isinstance(want, list):
        return isinstance(got, list) and len(want) == len(got) and all(map(floats_match, want, got))
    if want is None or got is None:
        return want is got
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return math.isclose(want, got, rel_tol=FLOAT_RELATIVE_TOLERANCE, abs_tol=1e-12)


def record_of(result) -> dict:
    return dict(
        token_ids=result.token_ids,
        text=result.text,
        answer_length=result.answer_length,
        nfe=result.nfe,
        steps_per_block=result.steps_per_block,
        early_stopped=result.early_stopped,
        commit_step=result.trace.commit_step,
        commit_step_in_block=result.trace.commit_step_in_block,
        first_confidence=result.trace.first_confidence,
        computed_fraction=result.computed_fraction,
    )


def refuses(method: str, kw: dict) -> bool:
    """Whether the preset refuses the case's settings (an InputError naming them), as a user would be told."""
    settings = {k: v for k, v in kw.items() if k != "batch_size"}
    try:
        build_config(method, **settings)
    except InputError:
        return True
    return False


def compute(models: dict) -> dict:
    out = {}
    for name, model, prompts, kw in CASES:
        for method in method_names(block_causal=False):
            if family_refusal(models[model], build_config(method)):
                continue  # a preset this family refuses (its forward needs what the family lacks)
            # Elastic-Cache's official loop lays one block of gen_length: the case's block length is not its
            # own.
            own = kw if lays_blocks(method) else dict(kw, block_length=None)
            if refuses(method, own):
                continue  # e.g. localleap at threshold 0.2: its relaxed threshold (0.75) would exceed it
            out[f"{name}/{method}"] = [
                record_of(r) for r in models[model].generate(prompts, method=method, **own)
            ]
    name, model, prompts, kw = SAMPLING_CASE
    out[name] = [record_of(r) for r in models[model].generate(prompts, **kw)]
    return out


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        records = compute(load_models(Path(tmp)))
    RECORD.write_text(json.dumps(records, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {len(records)} cases to {RECORD}", file=sys.stderr)
