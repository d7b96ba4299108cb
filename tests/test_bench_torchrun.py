"""`caidllm bench` under torchrun (2 processes, gloo, CPU): the same per-sample
records and accuracy as one process, the world size in the settings, and a
failing rank fails the whole run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from caidllm.distributed import World
from caidllm.errors import InputError

BENCH = Path(__file__).parent / "data" / "bench"
ARGS = [
    "bench",
    "--model",
    "tiny",
    "--task",
    "synthetic:arithmetic",
    "--task",
    "bbh:boolean_expressions",
    "--data-dir",
    str(BENCH),
    "--methods",
    "vanilla,cai",
    "--limit",
    "5",
    "--gen-length",
    "32",
    "--block-length",
    "16",
    "--batch-size",
    "2",
    "--no-progress",
]


def _env():
    src = str(Path(__file__).parents[1] / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {
        **env,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")])),
        "TOKENIZERS_PARALLELISM": "false",
    }


def _torchrun(*args, nproc=2):
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "caidllm",
        *args,
    ]


def _records(folder: Path) -> dict:
    return {
        p.name: [json.loads(line) for line in p.read_text().splitlines()]
        for p in folder.glob("samples_*.jsonl")
    }


def test_two_ranks_write_the_report_of_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    done = subprocess.run(
        [sys.executable, "-m", "caidllm", *ARGS, "--out", str(one)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    done = subprocess.run(
        _torchrun(*ARGS, "--out", str(two)), env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("# caidllm bench results") == 1  # rank 0 alone prints the report

    records_one, records_two = _records(one), _records(two)
    assert len(records_one) == 4 and records_one.keys() == records_two.keys()
    for name, rows in records_one.items():
        assert len(rows) >= 4 and len(rows) == len(records_two[name])
        for a, b in zip(rows, records_two[name]):
            assert (a["id"], a["generated"], a["score"], a["nfe"], a["steps_per_block"]) == (
                b["id"],
                b["generated"],
                b["score"],
                b["nfe"],
                b["steps_per_block"],
            )

    report_one = json.loads((one / "results.json").read_text())
    report_two = json.loads((two / "results.json").read_text())
    assert report_one["settings"]["world_size"] == 1 and report_two["settings"]["world_size"] == 2
    assert len(report_two["settings"]["ranks"]) == 2
    for a, b in zip(report_one["results"], report_two["results"]):
        assert (a["task"], a["method"], a["n"]) == (b["task"], b["method"], b["n"])
        for key in (
            "accuracy",
            "stderr",
            "nfe_mean",
            "steps_per_block",
            "answer_tokens",
            "confidence_buckets",
        ):
            assert a[key] == b[key], key
        assert b["wall_s"] == max(b["wall_s_per_rank"]) and len(b["wall_s_per_rank"]) == 2
        assert b["tps_positions"] == pytest.approx(b["n"] * 32 / b["wall_s"])


def test_a_failing_rank_fails_the_run(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")  # rank 0 cannot write its report here; rank 1 must not go on alone
    done = subprocess.run(
        _torchrun(*ARGS, "--out", str(not_a_folder)), env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "cannot write to output directory" in done.stderr
    assert "rank 0 failed" in done.stderr  # what rank 1 says
    # one line per rank, no traceback of ours (torchrun prints its own)
    assert "caidllm/bench/" not in done.stderr
    assert not (not_a_folder.parent / "results.json").exists()


def test_world_from_env_and_shards():
    world = World.from_env({"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1"})
    assert world.distributed and not world.is_main
    assert world.shard(8) == [1, 4, 7]
    shards = [World(r, 3).shard(8) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(8))
    assert World.from_env({}).world_size == 1 and World().gather("x") == ["x"]
    with pytest.raises(InputError, match="within WORLD_SIZE"):
        World.from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(InputError, match="integers"):
        World.from_env({"RANK": "a"})
    assert World(0, 2).device("cpu") == "cpu" and World(0, 1).device("cuda:3") == "cuda:3"
    with pytest.raises(InputError, match="LOCAL_RANK"):
        World(0, 2).device("cuda:3")
