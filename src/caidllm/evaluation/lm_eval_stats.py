"""The decoding statistics of an lm-eval run through caidllm (evaluation/lm_eval_adapter.py): counters added
up batch by batch, combined over data-parallel ranks, summarised and written as JSON to `stats_path`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

# Counters that add up over batches and over ranks (wall_s does not: the ranks run side by side).
COUNTERS = (
    "requests",
    "nfe",
    "positions",
    "answer_tokens",
    "policy_s",
    "truncated_prompts",
    "prefill_positions",
    "reused_positions",
)
NOTE = (
    "wall_s covers the generate() calls only (no warm-up in lm-eval runs; use `caidllm bench` for timed "
    "comparisons); tps_positions = requests x gen_length / wall_s, tps_answer = answer tokens / wall_s"
)


def new_stats() -> dict:
    return {**dict.fromkeys(COUNTERS, 0), "policy_s": 0.0, "wall_s": 0.0, "steps_per_block_sum": []}


def account(stats: dict, results, wall: float, gen_length: int) -> None:
    """One generate() call's results (each one's policy_s is the whole call's)."""
    stats["requests"] += len(results)
    stats["nfe"] += sum(r.nfe for r in results)
    stats["positions"] += len(results) * gen_length
    stats["answer_tokens"] += sum(r.answer_length for r in results)
    stats["wall_s"] += wall
    stats["policy_s"] += results[0].policy_s
    stats["prefill_positions"] += sum(r.prefill_positions for r in results)
    stats["reused_positions"] += sum(r.reused_positions for r in results)
    per_block = stats["steps_per_block_sum"]
    for r in results:
        per_block.extend([0] * (len(r.steps_per_block) - len(per_block)))
        for b, steps in enumerate(r.steps_per_block):
            per_block[b] += steps


def combined(per_rank: list[dict]) -> dict:
    """The ranks' statistics as one run's: counts add up, the wall time is the slowest rank's (they ran
    side by side). lm-eval pads the shorter ranks with copies of their last request; those count too."""
    total = {k: sum(s[k] for s in per_rank) for k in COUNTERS}
    total["wall_s"] = max(s["wall_s"] for s in per_rank)
    total["busy_s"] = sum(s["wall_s"] for s in per_rank)
    blocks = max(len(s["steps_per_block_sum"]) for s in per_rank)
    total["steps_per_block_sum"] = [
        sum(s["steps_per_block_sum"][b] for s in per_rank if b < len(s["steps_per_block_sum"]))
        for b in range(blocks)
    ]
    return total


def summary(stats: dict, run: dict) -> dict:
    """What stats_path holds: `run` (model, method, lengths, batch size, device, world size) and the
    figures of `stats`."""
    n, wall = stats["requests"], stats["wall_s"]
    prefilled, reused = stats.get("prefill_positions", 0), stats.get("reused_positions", 0)
    figures = {
        "requests": n,
        "nfe_mean": stats["nfe"] / n if n else None,
        "steps_per_block": [v / n for v in stats["steps_per_block_sum"]] if n else [],
        "wall_s": wall,
        "tps_positions": stats["positions"] / wall if wall else None,
        "tps_answer": stats["answer_tokens"] / wall if wall else None,
        "policy_share": stats["policy_s"] / stats.get("busy_s", wall) if wall else None,
        "truncated_prompts": stats["truncated_prompts"],
        # the prefix store (block-causal models): prompt positions prefilled per request, the share reused
        "prefill_positions_mean": prefilled / n if n else None,
        "prefill_saved_share": reused / (prefilled + reused) if reused else 0.0,
    }
    return {**run, **figures, "note": NOTE}


def write(path: Path | None, figures: dict, logger: logging.Logger) -> None:
    """The summary as JSON at `path` (none: not written); a path that cannot be written is a warning."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")
    except OSError as e:
        logger.warning("cannot write decoding statistics to %s: %s", path, e)
