"""Where the benchmark data lives when --data-dir is not given."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "CAIDLLM_DATA_DIR"
PROJECT_ROOT = Path(__file__).resolve().parents[3]  # src/caidllm/bench/datadir.py -> the checkout


def candidates(cwd: Path | None = None) -> list[Path]:
    """In order: $CAIDLLM_DATA_DIR, ../shared/data from the current directory
    (and shared/data below it), ../shared/data from the project root of this
    checkout (found from the package location)."""
    cwd = Path.cwd() if cwd is None else cwd
    found = []
    if os.environ.get(ENV):
        found.append(Path(os.environ[ENV]).expanduser())
    found += [
        cwd.parent / "shared" / "data",
        cwd / "shared" / "data",
        PROJECT_ROOT.parent / "shared" / "data",
    ]
    unique = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def default_data_dir(cwd: Path | None = None) -> Path | None:
    for path in candidates(cwd):
        if path.is_dir():
            return path.resolve()
    return None
