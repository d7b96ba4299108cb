"""LongBench: the paper's four tasks by name (``longbench:narrativeqa``,
``multifieldqa_en``, ``gov_report``, ``qmsum``: DATA/longbench/<name>.jsonl,
or the hub copy without a data folder), or a user file
(``longbench:FILE``): JSON lines with ``input``, ``context`` and ``answers``
(a list of strings, or one string), optionally ``dataset``.

Metric per record: ROUGE-L for the summarisation sets (gov_report, qmsum,
multi_news, vcsum, samsum), token F1 for everything else (and when there is
no ``dataset`` field); the maximum over the reference answers. The context
is cut in the middle (LongBench style) when the prompt would not fit the
model next to the generation canvas.
"""

from __future__ import annotations

from pathlib import Path

from caidllm.bench.metrics import best_over, rouge_l, token_f1
from caidllm.bench.tasks.base import CONTEXT_SLOT, BenchTask, Sample, Scored, field_of, read_jsonl, take
from caidllm.bench.tasks.sources import LONGBENCH_TASKS, task_records
from caidllm.errors import InputError

ROUGE_DATASETS = {"gov_report", "qmsum", "multi_news", "vcsum", "samsum"}


def metric_of(dataset: str | None) -> str:
    return "rougeL" if dataset and dataset.removesuffix("_e") in ROUGE_DATASETS else "f1"


def score_text(text: str, answers: list[str], metric: str) -> Scored:
    fn = rouge_l if metric == "rougeL" else token_f1
    prediction = text.strip()
    return Scored(
        score=best_over(fn, prediction, answers), extracted=prediction[:200], details={"metric": metric}
    )


def template_for(question: str, metric: str) -> str:
    if metric == "rougeL":
        ask = question.strip() or "Summarize the text above."
        return f"{CONTEXT_SLOT}\n\n{ask}"
    return (
        f"{CONTEXT_SLOT}\n\nAnswer the question based on the text above. Only give the answer.\n\n"
        f"Question: {question}\nAnswer:"
    )


REQUIRED = ("input", "context", "answers")


def load(path: str, limit: int | None, data_dir: Path | None) -> BenchTask:
    """`longbench:NAME` for the paper's tasks (LONGBENCH_TASKS), else `longbench:FILE`."""
    what = f"longbench:{path}"
    if path in LONGBENCH_TASKS:
        records, where = task_records(what, data_dir, required=REQUIRED)
        return build(what, records, where, limit, dataset=path)
    file = Path(path).expanduser()
    if not file.exists() and data_dir is not None and (data_dir / path).exists():
        file = data_dir / path
    return build(what, read_jsonl(file, what, required=REQUIRED), str(file), limit)


def build(
    what: str, records: list[tuple[int, dict]], file: str, limit: int | None, dataset: str | None = None
) -> BenchTask:
    """The task from its records; `dataset` names the LongBench set when the records do not."""
    _, chosen = take(records, limit, 0, what)
    samples, metrics = [], set()
    for lineno, r in chosen:
        question = field_of(r, "input", str, file, lineno, what)
        context = field_of(r, "context", str, file, lineno, what)
        answers = r["answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
            raise InputError(
                f"{what}: {file} line {lineno}: answers must be a non-empty list of strings, "
                f"got {r['answers']!r:.80}"
            )
        named = r.get("dataset") if isinstance(r.get("dataset"), str) and r.get("dataset") else dataset
        metric = metric_of(named)
        metrics.add(metric)
        template = template_for(question, metric)
        samples.append(
            Sample(
                id=f"longbench/{lineno}",
                prompt=template.replace(CONTEXT_SLOT, context),
                reference=(answers, metric),
                context=context,
                template=template,
            )
        )
    return BenchTask(
        name=what,
        metric="/".join(sorted(metrics)),
        samples=samples,
        scorer=lambda text, s: score_text(text, *s.reference),
        source=file,
        notes="score in [0, 1]: token F1 (QA) or ROUGE-L F1 (summarisation), max over answers",
    )
