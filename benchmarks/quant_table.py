"""The quantization table of BENCHMARKS.md from the runs of benchmarks/quant_grid.sh.

    python benchmarks/quant_table.py runs/quant [more run folders ...]

Reads every results.json under the folders (one per weight setting), and for each task, method
and setting prints accuracy ± stderr, NFE, wall time, weights, the share of the answers identical
to fp32's (the extracted answers of the same questions, same method) and the share of positions
whose first-step confidence exceeds 0.9.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("fp32", "bf16", "int8", "int8-dynamic", "int4")


def setting_of(settings: dict) -> str:
    if settings.get("quantization"):
        return settings["quantization"]
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[settings["dtype"]]


def load_runs(folders: list[str]) -> dict:
    """(task, method, setting) -> (row, {sample id: (extracted answer, generated text)})."""
    runs = {}
    for folder in folders:
        for path in sorted(Path(folder).rglob("results.json")):
            report = json.loads(path.read_text())
            setting = setting_of(report["settings"])
            for row in report["results"]:
                answers = {}
                with open(path.parent / row["samples"], encoding="utf-8") as f:
                    for line in f:
                        record = json.loads(line)
                        answers[record["id"]] = (record["extracted"], record["generated"])
                runs[(row["task"], row["method"], setting)] = (row, answers)
    return runs


def table(runs: dict) -> str:
    lines = [
        "| Task | Method | Weights | n | Score ± stderr (%) | NFE | Wall (s) | weights_mb | "
        "Same answer as fp32 | Same text as fp32 | s_i > 0.9 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(task, method) for task, method, _ in runs})
    for task, method in keys:
        reference = runs.get((task, method, "fp32"))
        for setting in ORDER:
            if (task, method, setting) not in runs:
                continue
            row, answers = runs[(task, method, setting)]
            same = [agreement(answers, reference[1] if reference else {}, part) for part in (0, 1)]
            share = row.get("high_first_confidence_share")
            lines.append(
                f"| {task} | {method} | {setting} | {row['n']} | {100 * row['accuracy']:.2f} ± "
                f"{100 * row['stderr']:.2f} | {row['nfe_mean']:.2f} | {row['wall_s']:.1f} | "
                f"{row['weights_mb']:.2f} | {same[0]} | {same[1]} | "
                f"{'n/a' if share is None else f'{100 * share:.1f}%'} |"
            )
    return "\n".join(lines)


def agreement(answers: dict, reference: dict, part: int) -> str:
    """Share of the questions both runs answered whose answer (part 0) or whole text (1) is the same."""
    common = [i for i in answers if i in reference]
    if not common:
        return "n/a"
    return f"{100 * sum(answers[i][part] == reference[i][part] for i in common) / len(common):.1f}%"


def main(argv=None) -> int:
    folders = (argv if argv is not None else sys.argv[1:]) or ["runs/quant"]
    print(table(load_runs(folders)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
