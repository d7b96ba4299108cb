"""Datasets, prompts and scoring for the caidllm_* lm-eval task configs.

The data are read offline by caidllm.bench's loaders (the same prompts and
scorers as ``caidllm bench``, so both harnesses agree), from the folder given
by ``--metadata '{"data_dir": "DIR"}'``, else $CAIDLLM_DATA_DIR, else
../shared/data from the current directory or the project root; with no data
folder, from the benchmarks' Hugging Face hub copies (caidllm.bench.tasks.sources).
"""

from __future__ import annotations

import json
from pathlib import Path

from caidllm.bench.datadir import default_data_dir
from caidllm.bench.tasks import load_task, reference_scorer
from caidllm.tasks.base import final_line

METRIC_NAMES = {"exact_match": "exact_match", "pass@1": "pass_at_1", "f1": "f1", "rougeL": "rougeL"}


def fewshot_target(reference: object) -> str:
    """A row's answer when lm-eval shows it as a few-shot example (``--num_fewshot K``): the
    final line the bench's shots end with, "So the answer is X."; empty (no answer shown)
    where the reference is no single answer string (code tests, choices)."""
    return final_line(reference) if isinstance(reference, str) else ""


def dataset(task: str, data_dir: str | None = None, limit: int | None = None, **_ignored):
    """A DatasetDict with one "test" split of the bench samples of `task`
    (a `caidllm bench --task` spec)."""
    import datasets

    folder = Path(data_dir).expanduser() if data_dir else default_data_dir()  # None: the hub copy
    bench_task = load_task(task, data_dir=folder, limit=limit)
    rows = [
        {
            "id": s.id,
            "task": task,
            "prompt": s.prompt,
            "reference": json.dumps(s.reference),
            "fewshot_target": fewshot_target(s.reference),
        }
        for s in bench_task.samples
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def process_results(doc: dict, results: list[str]) -> dict:
    scored = reference_scorer(doc["task"])(results[0], json.loads(doc["reference"]))
    metric = "pass_at_1" if doc["task"] in ("humaneval", "mbpp") else "exact_match"
    out = {metric: scored.score}
    if doc["task"] == "gsm8k":
        out["exact_match_flexible"] = float(scored.details.get("flexible", 0.0))
    return out
