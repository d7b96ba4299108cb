"""Where a file-based task's records come from.

With a data folder (``--data-dir``, ``$CAIDLLM_DATA_DIR``, or one found next
to the checkout), each task reads its file in that folder (``LOCAL_LAYOUT``).
Without one, the same benchmark is loaded through the Hugging Face
``datasets`` library (``pip install 'caidllm[eval]'``; the hub copy is cached
by ``datasets`` after the first download) and every hub row is mapped to the
record layout of the local file, so the same loaders and scorers run on
both. Offline without a data folder, the error names the folder layout to
provide and how to point ``--data-dir`` at it.

Rows of a hub split are numbered from 1 and reported as "line N" in errors,
like the lines of a local file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from caidllm.bench.tasks.base import read_jsonl
from caidllm.errors import InputError

# The four LongBench tasks of the paper (LongBench's dataset names).
LONGBENCH_TASKS = ("narrativeqa", "multifieldqa_en", "gov_report", "qmsum")


@dataclass(frozen=True)
class HubSource:
    """A split of a dataset on the Hugging Face hub, and how one of its rows
    becomes a record of the local file's layout."""

    path: str  # the hub dataset id
    config: str | None  # its configuration (subset) name
    split: str
    to_record: Callable[[dict], dict] = dict

    def describe(self) -> str:
        config = f", config {self.config}" if self.config else ""
        return f"hub dataset {self.path} ({self.split} split{config})"


def _longbench_record(row: dict, dataset: str) -> dict:
    """LongBench rows (the parquet copy lm-eval reads) name the question
    "question" or, as the original release, "input"; ours name it "input" and
    carry the dataset name, which picks the metric."""
    record = dict(row)
    if "input" not in record and "question" in record:
        record["input"] = record.pop("question")
    if not record.get("dataset"):
        record["dataset"] = dataset
    return record


def _piqa_record(row: dict) -> dict:
    return {k: row.get(k) for k in ("goal", "sol1", "sol2", "label")}


def _winogrande_record(row: dict) -> dict:
    return {k: row.get(k) for k in ("sentence", "option1", "option2", "answer")}


def _bbh_example(row: dict) -> dict:
    return {"input": row.get("input"), "target": row.get("target")}


def _fixed_sources() -> dict[str, HubSource]:
    return {
        "gsm8k": HubSource("openai/gsm8k", "main", "test"),
        "mbpp": HubSource("google-research-datasets/mbpp", "full", "test"),
        "piqa": HubSource("baber/piqa", None, "validation", _piqa_record),
        "winogrande": HubSource("allenai/winogrande", "winogrande_xl", "validation", _winogrande_record),
        "mathqa": HubSource("regisss/math_qa", None, "test"),
    }


def hub_source(task: str) -> HubSource:
    """The hub copy of a task ("gsm8k", "bbh:<name>", "longbench:<name>", ...)."""
    kind, _, name = task.partition(":")
    if kind == "bbh":
        return HubSource("SaylorTwift/bbh", name, "test", _bbh_example)
    if kind == "longbench":
        if name not in LONGBENCH_TASKS:
            raise InputError(
                f"no hub copy of longbench:{name}; named LongBench tasks: {', '.join(LONGBENCH_TASKS)}"
            )
        return HubSource("Xnhyacinth/LongBench", name, "test", lambda row: _longbench_record(row, name))
    sources = _fixed_sources()
    if task not in sources:
        raise InputError(f"task {task!r} has no hub copy")
    return sources[task]


def local_layout(task: str) -> str:
    """The file a task reads inside the data folder."""
    kind, _, name = task.partition(":")
    if kind == "bbh":
        return f"bbh/{name}.json"
    if kind == "longbench":
        return f"longbench/{name}.jsonl"
    return {
        "gsm8k": "gsm8k/test.jsonl",
        "mbpp": "mbpp/test.jsonl",
        "piqa": "piqa/validation.jsonl",
        "winogrande": "winogrande/validation.jsonl",
        "mathqa": "mathqa/test.jsonl",
    }[task]


def hub_rows(source: HubSource) -> list[dict]:
    """Every row of the split, as plain dicts (the only function that touches `datasets`)."""
    import datasets

    return [dict(row) for row in datasets.load_dataset(source.path, source.config, split=source.split)]


def task_records(
    task: str, data_dir: Path | None, required: tuple[str, ...] = (), reader=read_jsonl
) -> tuple[list[tuple[int, dict]], str]:
    """(line number, record) of the task, and where they came from: its file
    in `data_dir` when one is given (read by `reader`), else its hub copy."""
    if data_dir is not None:
        path = local_file(data_dir, task)
        return reader(path, task, required=required), str(path)
    return load_from_hub(task, required)


def load_from_hub(task: str, required: tuple[str, ...] = ()) -> tuple[list[tuple[int, dict]], str]:
    """(row number, record in the local file's layout) for every row of the
    task's hub copy, and a description of where they came from. InputError
    naming the data folder layout when the hub copy cannot be had, or a row
    that lacks a required field."""
    source = hub_source(task)
    try:
        import datasets  # noqa: F401 - only to say clearly when it is missing
    except ImportError:
        raise InputError(
            _no_data(task, source, "the datasets package is not installed (pip install 'caidllm[eval]')")
        ) from None
    try:
        rows = hub_rows(source)
    except Exception as error:  # noqa: BLE001 - offline, unknown config, hub errors: all mean "no data"
        reason = f"{type(error).__name__}: {error}".strip()
        raise InputError(_no_data(task, source, reason[:300])) from None
    if not rows:
        raise InputError(f"{task}: {source.describe()} has no rows")
    records = []
    for number, row in enumerate(rows, 1):
        record = source.to_record(row)
        missing = [k for k in required if record.get(k) is None]
        if missing:
            raise InputError(
                f"{task}: {source.describe()} line {number} lacks field(s) "
                f"{', '.join(map(repr, missing))} (has {', '.join(map(repr, row)) or 'none'})"
            )
        records.append((number, record))
    return records, source.describe()


def _no_data(task: str, source: HubSource, reason: str) -> str:
    from caidllm.bench.datadir import candidates

    looked = ", ".join(str(c) for c in candidates())
    return (
        f"task {task}: no benchmark data folder was found (looked in: {looked}) and its "
        f"{source.describe()} could not be loaded ({reason}). Either put the file in a folder laid out "
        f"as DIR/{local_layout(task)} and pass --data-dir DIR (or set CAIDLLM_DATA_DIR=DIR), "
        "or run once where the hub is reachable (datasets caches it)"
    )


def local_file(data_dir: Path, task: str) -> Path:
    return Path(data_dir) / local_layout(task)
