"""The whole fault matrix of `--tp 2` (issue 48): 36 cells, each a signal (SIGKILL, SIGTERM, SIGSTOP)
to rank 0 or rank 1 of `caidllm generate --tp 2` or `caidllm serve --tp 2` in one phase; prints the
markdown table of BENCHMARKS.md ("Tensor-parallel faults") and exits 1 if a cell ended otherwise than
expected or left a process. tests/test_tensor_parallel_faults.py runs a few cells in the suite.

    OMP_NUM_THREADS=1 python benchmarks/tp_fault_matrix.py [generate|serve ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.tp_faults import LIMIT_S, TIMEOUT_S, cells, expected_returncode, run_cell


def main(commands: list[str]) -> int:
    print(f"--tp-timeout {TIMEOUT_S:g} s; seconds from the signal to the job's end (every process gone)\n")
    print("| command | phase | signal | rank | exit | seconds | left | HTTP | last line |")
    print("|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for cell in cells():
        if commands and cell.command not in commands:
            continue
        try:
            run_cell(cell)
        except TimeoutError as error:
            cell.last_line = f"not run: {error}"
        ok = cell.returncode in expected_returncode(cell) and not cell.left and cell.seconds < LIMIT_S
        bad += not ok
        line = cell.last_line.replace("|", "/").removeprefix("caidllm: error: ")
        print(
            f"| {cell.command} | {cell.phase} | {cell.signal} | {cell.rank} | "
            f"{cell.returncode}{'' if ok else ' !'} "
            f"| {cell.seconds:.1f} | {len(cell.left)} | {cell.answer or '-'} | {line} |",
            flush=True,
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
