"""The code follows the linter and the formatter configured in pyproject.toml ([tool.ruff]): `ruff check`
and `ruff format --check` over the Python the project ships and runs (src, tests, benchmarks, training)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINTED = ["src", "tests", "benchmarks", "training"]

pytest.importorskip("ruff", reason="ruff is not installed: pip install -e '.[test]' brings it")


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *LINTED], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_check_passes():
    result = ruff("check", "--output-format", "concise", "--no-cache")
    assert result.returncode == 0, (
        "ruff check (fix with `ruff check --fix`, then by hand):\n"
        + result.stdout[-4000:]
        + result.stderr[-2000:]
    )


def test_ruff_format_leaves_every_file_as_it_is():
    result = ruff("format", "--check", "--no-cache")
    assert result.returncode == 0, (
        "not formatted (run `ruff format`):\n" + result.stdout[-4000:] + result.stderr[-2000:]
    )
