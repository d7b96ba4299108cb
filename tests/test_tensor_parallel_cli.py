"""`caidllm generate --tp N`: the command spawns its own ranks and prints what one process
prints; bad --tp values and a device gloo / nccl cannot drive are one-line errors (exit 2)
before any rank starts; a rank that dies or raises mid-run stops the whole group with one
line naming the rank (exit 2), within a bounded time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from caidllm.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
ARGS = [
    "What is 2 plus 3?",
    "--device",
    "cpu",
    "--gen-length",
    "16",
    "--block-length",
    "8",
    "--method",
    "fastdllm",
    "--json",
]
SMALL = (
    "random:llada2-mini?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&head_dim=16&rotary_dim=8"
    "&vocab_size=512"
)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--tp", "3"], "--tp 3 does not divide the model's 4 attention heads"),
        (["--tp", "0"], "--tp must be a positive integer, got 0"),
        (["--tp", "2", "--compile"], "--tp does not take --compile or --quantize yet"),
        (["--tp", "2", "--tp-timeout", "0"], "--tp-timeout must be a positive number of seconds, got 0.0"),
        (["--tp", "1024"], "--tp 1024 needs 1024 ranks, but this machine has"),
        # (LLaDA2 decodes in blocks of 32: --block-length 8 would be refused first, from its config.json.)
        (
            [
                "--tp",
                "4",
                "--model",
                f"{SMALL}&num_key_value_heads=2&num_experts=16",
                "--block-length",
                "32",
                "--gen-length",
                "32",
            ],
            "--tp 4 does not divide the model's 2 key/value heads",
        ),
        (
            [
                "--tp",
                "4",
                "--model",
                f"{SMALL}&num_key_value_heads=4&num_experts=10&n_group=2&topk_group=2",
                "--block-length",
                "32",
                "--gen-length",
                "32",
            ],
            "--tp 4 does not divide the model's 10 experts",
        ),
    ],
)
def test_bad_tp_is_one_line_before_any_rank_starts(capsys, argv, needle):
    assert main(["generate", *ARGS, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1] and err[-1].startswith("caidllm: error:")


def test_tp_with_a_device_no_backend_drives(capsys):
    assert main(["generate", "hi", "--device", "meta", "--tp", "2"]) == 2
    assert "torch.distributed drives CPUs (gloo) and CUDA GPUs (nccl), not 'meta'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_tp_on_cuda_without_a_gpu(capsys):
    assert main(["generate", "hi", "--device", "cuda", "--tp", "2"]) == 2
    assert "--tp with --device cuda: no CUDA GPU is available here" in capsys.readouterr().err


def run_cli(*argv, fault=None, timeout=240):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if fault:
        env["CAIDLLM_TP_FAULT"] = fault
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "caidllm", "generate", *ARGS, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - started


def test_generate_tp_2_prints_the_tokens_of_one_process(capsys):
    assert main(["generate", *ARGS]) == 0
    alone = json.loads(capsys.readouterr().out)
    done, _ = run_cli("--tp", "2")
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr  # no semaphore left to the resource tracker (issue 48)
    assert json.loads(done.stdout)["token_ids"] == alone["token_ids"]


@pytest.mark.parametrize(
    "fault, needle",
    [
        ("1:3:die", "tensor-parallel rank 1 died (exit status 9)"),
        # a reported error (here before the rank joins the group: the watchdog ends rank 0's wait)
        ("1:0:raise", "tensor-parallel rank 1 failed: RuntimeError: injected fault"),
        ("1:3:hang", "tensor-parallel rank 0/2: a peer rank failed or hung during a forward's all-reduce"),
        # a rank that announced itself but never joins: joining is bounded by --tp-timeout (issue 48; was 300
        # s)
        ("1:0:hang", "tensor-parallel rank 0/2: the group did not form within 5 s"),
    ],
)
def test_a_rank_that_fails_stops_the_group(fault, needle):
    done, seconds = run_cli("--tp", "2", "--tp-timeout", "5", fault=fault)
    lines = [line for line in done.stderr.splitlines() if line.startswith("caidllm:")]
    assert done.returncode == 2 and lines == [f"caidllm: error: {needle}" + lines[0].split(needle, 1)[1]]
    assert "Traceback" not in done.stderr and seconds < 120
    if fault == "1:0:hang":
        assert lines[0].endswith("; rank 1 did not join while forming the group")


BENCH = [
    "bench",
    "--model",
    "tiny",
    "--task",
    "synthetic:arithmetic",
    "--methods",
    "fastdllm,cai",
    "--limit",
    "3",
    "--gen-length",
    "16",
    "--block-length",
    "8",
    "--device",
    "cpu",
    "--no-progress",
    "--no-warmup",
    "--json",
]
SAME = ("n", "accuracy", "nfe_mean", "steps_per_block", "answer_tokens", "errors")


def test_bench_tp_2_reports_what_one_process_reports(capsys):
    assert main(BENCH) == 0
    alone = json.loads(capsys.readouterr().out)["results"]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "caidllm", *BENCH, "--tp", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    sharded = json.loads(done.stdout)["results"]
    assert [{k: row[k] for k in SAME} for row in sharded] == [{k: row[k] for k in SAME} for row in alone]


def test_a_rank_whose_step_commits_other_tokens_stops():
    from types import SimpleNamespace

    from caidllm.decode.request import CommitEvent
    from caidllm.parallel.mirror import REPLAY, RanksDiverged, digest

    events = [CommitEvent("a", 0, 1, [3, 4], [17, 18], [0.9, 0.8])]
    engine = SimpleNamespace(last_digest=digest(events))
    REPLAY["check"](engine, digest(events))  # the same commits: nothing happens
    with pytest.raises(RanksDiverged, match="committed other tokens than rank 0's"):
        REPLAY["check"](engine, digest([CommitEvent("a", 0, 1, [3, 4], [17, 19], [0.9, 0.8])]))
