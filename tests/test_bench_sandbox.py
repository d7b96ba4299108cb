"""The sandbox that runs generated programs for pass@1: passes and failures are
told apart, and loops, fork bombs, disk filling, memory hogs and reads
outside the sandbox are stopped without harming the test process."""

import os
import time
from pathlib import Path

import pytest

from caidllm.bench.sandbox import NOBODY, Limits, isolation_summary, run_program

FAST = Limits(timeout_s=3.0, memory_mb=512, file_size_mb=1, processes=16)


def _uid_processes(uid):
    """Processes of `uid` that are not zombies."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            count += state != "Z"
    return count


def _sandbox_dirs():
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("caidllm-sandbox-*")}


def test_pass_fail_and_error_are_told_apart():
    before = _sandbox_dirs()
    assert run_program("assert sum([1, 2]) == 3\nprint('ok')", FAST).status == "passed"
    failed = run_program("def f(x):\n    return x\nassert f(1) == 2, 'f is wrong'", FAST)
    assert failed.status == "failed" and "AssertionError" in failed.reason
    error = run_program("def f(:\n    pass", FAST)
    assert error.status == "error" and "SyntaxError" in error.reason
    raised = run_program("raise ValueError('boom')", FAST)
    assert raised.status == "error" and "ValueError: boom" in raised.stderr_tail
    assert _sandbox_dirs() <= before  # temporary directories are removed


def test_infinite_loop_is_killed_at_the_timeout():
    started = time.monotonic()
    result = run_program("while True:\n    pass", Limits(timeout_s=1.5))
    assert result.status == "timeout"
    assert time.monotonic() - started < 10


def test_fork_bomb_is_contained_and_killed():
    uid = NOBODY if os.getuid() == 0 else os.getuid()
    before = _uid_processes(uid)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    started = time.monotonic()
    result = run_program(bomb, Limits(timeout_s=2.0, processes=16))
    assert result.status == "timeout"
    assert time.monotonic() - started < 15
    assert _uid_processes(uid) <= before  # nothing left behind


def test_children_left_behind_are_killed():
    uid = NOBODY if os.getuid() == 0 else os.getuid()
    before = _uid_processes(uid)
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n"
    assert run_program(program, FAST).status == "passed"
    assert _uid_processes(uid) <= before


def test_disk_filling_write_is_stopped_by_the_file_size_limit():
    program = "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 100000)\n"
    result = run_program(program, FAST)
    assert result.status == "error" and "file size limit" in result.reason


def test_memory_hog_is_stopped():
    result = run_program("x = bytearray(2 * 1024 ** 3)", FAST)
    assert result.status == "error" and "memory" in result.reason.lower()


def test_no_network():
    program = (
        "import socket\n"
        "try:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "except Exception as e:\n    print('blocked', type(e).__name__)\nelse:\n    raise SystemExit(3)\n"
    )
    result = run_program(program, FAST)
    assert result.status == "passed", result.stderr_tail


@pytest.mark.skipif(os.getuid() != 0, reason="the privilege drop applies when the runner is root")
def test_runs_unprivileged_and_cannot_read_private_files(tmp_path):
    assert isolation_summary().startswith("nobody")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    secret.chmod(0o600)
    assert run_program("import os\nassert os.getuid() != 0", FAST).status == "passed"
    result = run_program(f"print(open({str(secret)!r}).read())", FAST)
    assert result.status == "error" and "PermissionError" in result.reason
    outside = run_program(f"open({str(tmp_path / 'written.txt')!r}, 'w').write('x')", FAST)
    assert outside.status == "error" and not (tmp_path / "written.txt").exists()
