"""One method on one rank's share of a task: decode batch by batch (only the
`generate` calls are timed), then score every sample. A single process is a
rank that owns every sample. What it returns is plain data (picklable), so
rank 0 can gather it from the others.
"""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass, field

import torch

from caidllm.bench.measure import EnergyMeter, EnergyReading, MemoryMeter
from caidllm.bench.tasks import BenchTask, Sample, Scored
from caidllm.decode.prefix_reuse import forget_store
from caidllm.errors import CaidllmError


@dataclass
class Encoded:
    sample: Sample
    ids: list[int] | None
    error: str | None = None
    truncated: bool = False


@dataclass
class Outcome:
    """One sample: its generation (None if it failed or was never run), score and error."""

    result: object | None
    scored: Scored | None
    error: str | None


@dataclass
class ShardRun:
    outcomes: dict[int, Outcome]  # global sample index -> outcome
    wall_s: float
    policy_s: float
    engine_s: float
    forward_s: float
    energy: EnergyReading
    peak_mem_mb: float
    peak_mem_kind: str
    host: str = field(default_factory=platform.node)


def sync(lm) -> None:
    if torch.device(lm.device).type == "cuda":
        torch.cuda.synchronize(lm.device)


def run_shard(
    lm, settings, task: BenchTask, method: str, encoded: list[Encoded], indices: list[int]
) -> ShardRun:
    """Decode and score the samples at `indices` of `encoded` with `method`."""
    todo = [i for i in indices if encoded[i].ids is not None]
    batches = [todo[i : i + settings.batch_size] for i in range(0, len(todo), settings.batch_size)]
    generations: dict[int, object] = {}
    errors: dict[int, str] = {i: encoded[i].error for i in indices if encoded[i].error}
    memory, energy = MemoryMeter(lm.device), EnergyMeter(lm.device)
    wall = policy = engine = forward = 0.0
    progress = _progress(len(todo), f"{task.name} {method}", settings.progress)

    forget_store(lm)  # every row starts with an empty prefix store: no row finds another's prompts
    memory.reset()
    energy.start()
    for batch in batches:
        sync(lm)
        started = time.perf_counter()
        try:
            out_batch = _generate(lm, settings, task, method, [encoded[i] for i in batch])
        except CaidllmError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: record for these samples, go on
            sync(lm)
            wall += time.perf_counter() - started
            for i in batch:
                errors[i] = f"generation failed: {type(e).__name__}: {e}"
            progress.update(len(batch))
            continue
        sync(lm)
        wall += time.perf_counter() - started
        policy += out_batch[0].policy_s
        forward += out_batch[0].forward_s
        engine += out_batch[0].elapsed_s
        for i, result in zip(batch, out_batch):
            generations[i] = result
        progress.update(len(batch))
    reading = energy.stop()
    peak = memory.peak_mb()
    progress.close()
    outcomes = _outcomes(task, encoded, indices, generations, errors)  # scoring comes after the clock stopped
    return ShardRun(outcomes, wall, policy, engine, forward, reading, peak, memory.kind)


def _generate(lm, settings, task: BenchTask, method: str, batch: list[Encoded]) -> list:
    """One batch of samples decoded with `method` under the bench's settings."""
    options = settings.generate_options(method)
    if task.constraint_for is not None:  # each sample held to its own constraint
        options["constraint"] = [task.constraint_for(item.sample) for item in batch]
    return lm.generate([item.ids for item in batch], **options, batch_size=len(batch), chat=False)


def _outcomes(
    task: BenchTask, encoded: list[Encoded], indices: list[int], generations: dict, errors: dict
) -> dict[int, Outcome]:
    """Each sample's outcome: its result scored, or the error that left it without one."""
    outcomes = {}
    for i in indices:
        result = generations.get(i)
        if result is None:
            outcomes[i] = Outcome(None, None, errors.get(i))
        else:
            outcomes[i] = Outcome(result, *_score(task, result.text, encoded[i].sample))
    return outcomes


def _score(task: BenchTask, text: str, sample: Sample) -> tuple[Scored | None, str | None]:
    try:
        scored = task.score(text, sample)
    except Exception as e:  # noqa: BLE001 - one sample's scorer crash must not end the run
        return None, f"scoring failed: {type(e).__name__}: {e}"
    return scored, None


def _progress(total: int, desc: str, enabled: bool | None):
    from tqdm import tqdm

    disable = (not sys.stderr.isatty()) if enabled is None else not enabled
    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, disable=disable, leave=False)
