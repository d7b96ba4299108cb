"""training/run_chunks.sh: it resumes a run chunk after chunk until the run is over, and stops when a
chunk trains no step (it looped for ever on a finished run). `caidllm` is a stand-in here that
appends each chunk's scripted log lines, so no training runs."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "training" / "run_chunks.sh"
FAKE_CAIDLLM = """#!/usr/bin/env bash
# caidllm train --out RUN ...: the next line of $CHUNKS is this chunk's log ('|' between lines)
run=$3; n=$(cat "$run/chunks" 2>/dev/null || echo 0); echo $((n + 1)) > "$run/chunks"
line=$(sed -n "$((n + 1))p" "$CHUNKS")
[ -n "$line" ] || exit 3  # the script asked for a chunk the run does not have
echo "$line" | tr '|' '\\n' >> "$run/train.log"
"""
STOPPED_20 = '{"step": 20, "loss": 0.5}|{"event": "time limit reached", "step": 20}'
FINISHED_40 = '{"event": "resumed", "step": 20}|{"step": 40, "facts": 0.0, "validation": {}}'


def run_chunks(tmp_path, chunks):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "caidllm"
    fake.write_text(FAKE_CAIDLLM)
    fake.chmod(0o755)
    (tmp_path / "chunks.txt").write_text("\n".join(chunks) + "\n")
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "CHUNKS": str(tmp_path / "chunks.txt"),
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=30
    )
    return done.returncode, int((tmp_path / "run" / "chunks").read_text()), done.stderr


def test_it_resumes_until_the_log_ends_on_the_final_validation(tmp_path):
    assert run_chunks(tmp_path, [STOPPED_20, FINISHED_40])[:2] == (0, 2)


def test_it_resumes_a_run_that_still_has_steps_after_each_time_limit(tmp_path):
    chunks = [
        STOPPED_20,
        '{"event": "resumed", "step": 20}|{"event": "time limit reached", "step": 21}',
        '{"event": "resumed", "step": 21}|{"step": 40, "facts": 0.0, "validation": {}}',
    ]
    assert run_chunks(tmp_path, chunks)[:2] == (0, 3)


def test_it_stops_when_a_chunk_trains_no_step(tmp_path):
    """The old trainer logged the time limit after a finished run's validation: the next chunk only
    resumed."""
    finished_then_limit = (
        '{"step": 40, "facts": 0.0, "validation": {}}|{"event": "time limit reached", "step": 40}'
    )
    code, chunks, stderr = run_chunks(tmp_path, [finished_then_limit, '{"event": "resumed", "step": 40}'])
    assert (code, chunks) == (1, 2) and "trained no step" in stderr


def test_a_stop_file_ends_it_before_the_next_chunk(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "STOP").touch()
    (tmp_path / "run" / "chunks").write_text("0")
    assert run_chunks(tmp_path, [STOPPED_20])[:2] == (0, 0)
