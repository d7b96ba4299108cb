"""One row of the report (one task x one method) from every rank's share.

Per-sample figures (score, NFE, steps per block, confidence buckets) are
over all samples in task order, whichever rank decoded them. Timings: the
ranks ran side by side, so wall time is the slowest rank's, throughput is the
whole set over it; policy time and energy add up over ranks; memory is
the largest rank's peak.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from caidllm.bench.measure import EnergyReading
from caidllm.bench.metrics import mean, stderr
from caidllm.bench.prefix_rows import prefill_figures
from caidllm.bench.shard import Encoded, ShardRun
from caidllm.bench.tasks import BenchTask, Scored

CONFIDENCE_BUCKETS = (">0.50", "0.25-0.50", "<0.25")  # the paper's Figure 1c classes of s_i = c_i(0)
HIGH_CONFIDENCE = 0.9  # Fast-dLLM's commit threshold: the share above it drives threshold decoders' speed


def new_trace_store() -> dict:
    return {"buckets": {b: [] for b in CONFIDENCE_BUCKETS}, "steps": []}


def build_row(
    settings,
    task: BenchTask,
    method: str,
    encoded: list[Encoded],
    parts: list[ShardRun],
    out: Path | None,
    trace_store: dict,
    T: int,
    log,
    weights_mb: float | None = None,
) -> dict:
    outcomes = _all_outcomes(task, method, encoded, parts)
    samples = _Samples.score(task, method, encoded, outcomes, trace_store)
    done, wall = samples.done, max(p.wall_s for p in parts)
    answer_tokens = sum(r.answer_length for r in done)
    accuracy = mean(samples.scores)
    row = {
        "task": task.name,
        "method": method,
        "metric": task.metric,
        "n": len(encoded),
        "n_generated": len(done),
        "accuracy": accuracy,
        "stderr": stderr(samples.scores),
        "nfe_mean": mean(r.nfe for r in done),
        "forwards_per_block": mean(r.nfe / max(len(r.steps_per_block), 1) for r in done),
        "tokens_per_forward": answer_tokens / max(sum(r.nfe for r in done), 1) if done else None,
        # The block length the method decoded with: Elastic-Cache's official loop, one block of gen_length.
        "block_length": settings.lengths_for(method)["block_length"] or settings.gen_length,
        **_step_figures(settings, done, T),
        "wall_s": wall,
        "engine_s": max(p.engine_s for p in parts),
        "tps_positions": len(done) * settings.gen_length / wall if wall > 0 else None,
        "tps_answer": answer_tokens / wall if wall > 0 else None,
        "answer_tokens": answer_tokens,
        "speedup": None,
        "nfe_ratio": None,
        "weights_mb": weights_mb,
        **_cost_figures(parts, wall),
        **_work_figures(done),
        "errors": sum(1 for r in samples.records if r["error"]),
        "fewshot": task.fewshot,
        "confidence_buckets": _bucket_summary(done),
        "high_first_confidence_share": high_confidence_share(done),
        "samples": None,
    }
    if len(parts) > 1:
        row["wall_s_per_rank"] = [p.wall_s for p in parts]
    for k, values in samples.extras.items():
        row[f"accuracy_{k}"] = mean(values)
        row[f"stderr_{k}"] = stderr(values)
    if out is not None:
        row["samples"] = _write_samples(out, task, method, samples.records)
    shown = "n/a" if accuracy is None else f"{accuracy:.3f}"
    log(
        f"{task.name} {method}: score {shown}, NFE {row['nfe_mean']}, wall {wall:.2f} s, errors "
        f"{row['errors']}"
    )
    return row


def _all_outcomes(task: BenchTask, method: str, encoded: list[Encoded], parts: list[ShardRun]) -> dict:
    """Every rank's outcomes by sample index; all of them, or an error (never a report of a subset)."""
    outcomes = {i: o for part in parts for i, o in part.outcomes.items()}
    if sorted(outcomes) != list(range(len(encoded))):
        raise RuntimeError(
            f"{task.name} {method}: the ranks returned {len(outcomes)} of {len(encoded)} samples"
        )
    return outcomes


@dataclass
class _Samples:
    """The per-sample side of a row, in task order: scores (0 for a failed sample), the task's extra
    metrics, the samples file's records, and the results that generated."""

    scores: list[float]
    extras: dict[str, list[float]]
    records: list[dict]
    done: list

    @classmethod
    def score(cls, task: BenchTask, method: str, encoded: list[Encoded], outcomes: dict, trace_store: dict):
        samples = cls([], {k: [] for k in task.extra_metrics}, [], [])
        for i, enc in enumerate(encoded):
            outcome = outcomes[i]
            result, scored = outcome.result, outcome.scored
            score = scored.score if scored is not None else 0.0
            samples.scores.append(score)
            for k in samples.extras:
                samples.extras[k].append(float(scored.details.get(k, 0.0)) if scored is not None else 0.0)
            samples.records.append(_record(task, method, enc, result, scored, score, outcome.error))
            if result is not None:
                samples.done.append(result)
                collect_trace(result, trace_store)
        return samples


def _step_figures(settings, done: list, T: int) -> dict:
    """Denoising steps per block index: over all requests, over those that decoded the block, saved."""
    # A method may lay fewer blocks than the bench's block_length says (Elastic-Cache's one window over
    # the whole generation): its rows count what it laid, the rest as 0 steps.
    n_blocks = max([settings.gen_length // settings.block_length] + [len(r.steps_per_block) for r in done])
    steps = [list(r.steps_per_block) + [0] * (n_blocks - len(r.steps_per_block)) for r in done]
    spb = [mean(s[b] for s in steps) for b in range(n_blocks)] if steps else [None] * n_blocks
    decoded = [mean(s[b] for s in steps if s[b] > 0) for b in range(n_blocks)]
    return {
        "steps_per_block": spb,
        "steps_per_block_decoded": decoded,
        "steps_per_block_max": T,
        "steps_saved_per_block": [None if d is None else T - d for d in decoded],
    }


def _cost_figures(parts: list[ShardRun], wall: float) -> dict:
    """Memory, energy and where the time went (policy, forwards, the engine's own), over all ranks."""
    policy = sum(p.policy_s for p in parts)
    forward = sum(p.forward_s for p in parts)
    busy = sum(p.wall_s for p in parts)
    reading = combine_energy([p.energy for p in parts], [p.host for p in parts], wall)
    return {
        "peak_mem_mb": max(p.peak_mem_mb for p in parts),
        "peak_mem_kind": parts[0].peak_mem_kind,
        "energy_j": reading.joules,
        "energy_source": reading.source,
        "energy_note": reading.note,
        "avg_power_w": reading.avg_power_w,
        "policy_s": policy,
        "policy_share": policy / busy if busy > 0 else None,
        "forward_s": forward,
        "forward_share": forward / busy if busy > 0 else None,
        "engine_overhead_share": (busy - forward - policy) / busy if busy > 0 else None,
    }


def _work_figures(done: list) -> dict:
    """How much work the decoders skipped: computed share of layer-token work, prefill, early stops."""
    fractions = [getattr(r, "computed_fraction", None) for r in done]
    fractions = [f for f in fractions if f is not None]
    return {
        "flops_share": mean(fractions) if fractions else None,
        **prefill_figures(done),
        "early_stopped": mean(float(r.early_stopped) for r in done),
    }


def _write_samples(out: Path, task: BenchTask, method: str, records: list[dict]) -> str:
    """One JSON line per sample; returns the file's name (the row's "samples")."""
    path = out / f"samples_{slug(task.name)}_{slug(method)}.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    return path.name


def combine_energy(readings: list[EnergyReading], hosts: list[str], wall: float) -> EnergyReading:
    """Energy of all ranks: GPU boards add up; a CPU package counter already covers every process on
    it, so per host only the largest reading counts."""
    if len(readings) == 1:
        return readings[0]
    missing = next((r for r in readings if r.joules is None), None)
    if missing is not None:
        return missing
    if readings[0].source == "rapl-package":
        per_host: dict[str, float] = {}
        for host, r in zip(hosts, readings):
            per_host[host] = max(per_host.get(host, 0.0), r.joules)
        joules = sum(per_host.values())
    else:
        joules = sum(r.joules for r in readings)
    note = f"{readings[0].note}; summed over {len(readings)} ranks".lstrip("; ")
    return EnergyReading(joules, joules / wall if wall > 0 else None, readings[0].source, note)


def _record(
    task, method, enc: Encoded, result, scored: Scored | None, score: float, error: str | None
) -> dict:
    return {
        "id": enc.sample.id,
        "task": task.name,
        "method": method,
        "prompt": enc.sample.prompt if enc.sample.context is None else enc.sample.render("<context>"),
        "prompt_tokens": None if enc.ids is None else len(enc.ids),
        "prompt_truncated": enc.truncated,
        "generated": None if result is None else result.text,
        "extracted": None if scored is None else scored.extracted,
        "score": score,
        "correct": bool(scored is not None and scored.correct),
        "nfe": None if result is None else result.nfe,
        "answer_length": None if result is None else result.answer_length,
        "steps_per_block": None if result is None else result.steps_per_block,
        "early_stopped": None if result is None else result.early_stopped,
        "prefill_positions": None if result is None else result.prefill_positions,
        "reused_positions": None if result is None else result.reused_positions,
        "details": None if scored is None else scored.details,
        "error": error,
    }


def _bucket_of(confidence: float) -> str:
    return ">0.50" if confidence > 0.50 else "<0.25" if confidence < 0.25 else "0.25-0.50"


def collect_trace(result, store: dict) -> None:
    store["steps"].append(list(result.steps_per_block))
    trace = result.trace
    for confidence, step in zip(trace.first_confidence, trace.commit_step_in_block):
        if confidence is None or step < 0 or (isinstance(confidence, float) and math.isnan(confidence)):
            continue
        store["buckets"][_bucket_of(confidence)].append(step)


def high_confidence_share(done, threshold: float = HIGH_CONFIDENCE) -> float | None:
    """Share of decoded positions whose first-step confidence s_i exceeds `threshold`."""
    seen = [c for r in done for c in r.trace.first_confidence if c is not None and not math.isnan(c)]
    return sum(c > threshold for c in seen) / len(seen) if seen else None


def _bucket_summary(done) -> dict:
    store = new_trace_store()
    for r in done:
        collect_trace(r, store)
    return {b: {"tokens": len(v), "mean_commit_step": mean(v)} for b, v in store["buckets"].items()}


def relative(rows: list[dict]) -> None:
    first = rows[0]
    for row in rows:
        if first["wall_s"] and row["wall_s"]:
            row["speedup"] = first["wall_s"] / row["wall_s"]
        if first["nfe_mean"] and row["nfe_mean"]:
            row["nfe_ratio"] = first["nfe_mean"] / row["nfe_mean"]


def slug(name: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)
    return keep.strip("-") or "task"
