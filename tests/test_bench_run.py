"""`caidllm bench` end to end on tiny random checkpoints and the fixture data:
complete results, Markdown table, plots, per-sample records, --json, and
clear errors for bad input."""

import json
from pathlib import Path

import pytest

from caidllm.bench import BenchConfig, run_bench
from caidllm.bench.tasks import BenchTask, Sample, Scored
from caidllm.cli import main

DATA = Path(__file__).parent / "data"
BENCH = DATA / "bench"
SMALL = ["--gen-length", "16", "--block-length", "8", "--batch-size", "2", "--no-progress"]
REQUIRED = {
    "task",
    "method",
    "n",
    "accuracy",
    "stderr",
    "nfe_mean",
    "steps_per_block",
    "wall_s",
    "tps_positions",
    "tps_answer",
    "speedup",
    "peak_mem_mb",
    "energy_j",
    "policy_share",
}


def _bench(*args):
    return main(["bench", *args, *SMALL])


def test_two_methods_write_results_table_plots_and_samples(llada_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = _bench(
        "--model",
        str(llada_dir),
        "--task",
        "bbh:boolean_expressions",
        "--task",
        "synthetic:arithmetic",
        "--methods",
        "vanilla,cai",
        "--limit",
        "3",
        "--data-dir",
        str(BENCH),
        "--out",
        str(out),
    )
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    assert report["settings"]["methods"] == ["vanilla", "cai"]
    assert report["settings"]["prompting"]["bbh:boolean_expressions"] == "zero-shot"
    rows = report["results"]
    assert [(r["task"], r["method"]) for r in rows] == [
        ("bbh:boolean_expressions", "vanilla"),
        ("bbh:boolean_expressions", "cai"),
        ("synthetic:arithmetic", "vanilla"),
        ("synthetic:arithmetic", "cai"),
    ]
    for row in rows:
        assert REQUIRED <= set(row), REQUIRED - set(row)
        assert row["n"] == 3 and 0.0 <= row["accuracy"] <= 1.0 and row["errors"] == 0
        assert row["nfe_mean"] >= 1 and len(row["steps_per_block"]) == 2
        assert row["wall_s"] > 0 and row["tps_positions"] > 0 and row["tps_answer"] >= 0
        assert row["peak_mem_mb"] > 0 and 0.0 <= row["policy_share"] <= 1.0
        assert row["energy_j"] is None or row["energy_j"] >= 0
        lines = (out / row["samples"]).read_text().splitlines()
        assert len(lines) == 3
        record = json.loads(lines[0])
        assert {"id", "generated", "extracted", "correct", "nfe", "error"} <= set(record)
    assert rows[0]["speedup"] == pytest.approx(1.0) and rows[0]["nfe_ratio"] == pytest.approx(1.0)
    assert rows[0]["nfe_mean"] == 16  # vanilla: one step per position
    table = (out / "results.md").read_text()
    assert "## bbh:boolean_expressions" in table and "| vanilla |" in table and "| cai |" in table
    assert "Score ± stderr" in table and "answer tokens per second" in table
    for name in ("accuracy_vs_speedup.png", "confidence_vs_stability.png", "steps_saved_per_block.png"):
        assert (out / name).stat().st_size > 1000
    assert "| cai |" in capsys.readouterr().out  # without --json: the table on stdout


def test_a_method_over_the_whole_generation_sits_beside_block_wise_ones(llada_dir, tmp_path):
    """Elastic-Cache's one window over the generation lays one block where the bench says two: its row
    counts the steps it took, the missing blocks as 0, and the plots are drawn."""
    out = tmp_path / "run"
    code = _bench(
        "--model",
        str(llada_dir),
        "--task",
        "bbh:boolean_expressions",
        "--methods",
        "fastdllm,elastic",
        "--limit",
        "2",
        "--data-dir",
        str(BENCH),
        "--out",
        str(out),
    )
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [len(r["steps_per_block"]) for r in rows] == [2, 2]
    assert rows[1]["steps_per_block"][1] == 0 and rows[1]["steps_per_block"][0] == rows[1]["nfe_mean"]
    assert (out / "steps_saved_per_block.png").stat().st_size > 1000


def test_json_output_parses_and_has_the_required_keys(llada_dir, capsys):
    code = _bench(
        "--model",
        str(llada_dir),
        "--task",
        "synthetic:boolean_expressions",
        "--methods",
        "fastdllm",
        "--limit",
        "2",
        "--json",
    )
    assert code == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert {"settings", "results"} <= set(report)
    (row,) = report["results"]
    assert REQUIRED <= set(row)
    assert row["task"] == "synthetic:boolean_expressions" and row["method"] == "fastdllm" and row["n"] == 2
    assert row["samples"] is None  # no --out: nothing written


def test_every_data_task_runs(dream_dir, tmp_path):
    """Each loader through the runner once (Dream checkpoint, one method),
    LongBench's context cut in the middle to fit the model."""
    long_file = tmp_path / "long.jsonl"
    long_context = " ".join(f"word{i}" for i in range(3000))
    long_file.write_text(
        json.dumps(
            {
                "input": "Which word comes first?",
                "context": long_context,
                "answers": ["word0"],
                "dataset": "narrativeqa",
            }
        )
        + "\n"
    )
    tasks = [
        "gsm8k",
        "piqa",
        "winogrande",
        "mbpp",
        "bbh:date_understanding",
        f"mathqa:{DATA / 'mathqa.jsonl'}",
        f"longbench:{long_file}",
    ]
    report = run_bench(
        BenchConfig(
            model=str(dream_dir),
            tasks=tasks,
            methods=["cai"],
            limit=1,
            batch_size=2,
            gen_length=16,
            block_length=8,
            data_dir=str(BENCH),
            out=str(tmp_path / "o"),
            warmup=False,
            progress=False,
            code_timeout=5.0,
        ),
        log=lambda message: None,
    )
    rows = {r["task"]: r for r in report["results"]}
    assert set(rows) == set(tasks)
    assert rows["mbpp"]["metric"] == "pass@1" and rows["gsm8k"]["accuracy_flexible"] is not None
    assert all(r["errors"] == 0 and r["n_generated"] == 1 for r in rows.values())
    record = json.loads((tmp_path / "o" / rows[f"longbench:{long_file}"]["samples"]).read_text())
    assert record["prompt_truncated"] is True and record["prompt_tokens"] <= 1024 - 16
    mbpp = json.loads((tmp_path / "o" / rows["mbpp"]["samples"]).read_text())
    assert mbpp["details"]["status"] in ("passed", "failed", "timeout", "error")


def test_a_scorer_crash_is_recorded_and_the_run_goes_on(llada_dir, tmp_path, monkeypatch):
    def scorer(text, sample):
        if sample.id == "s1":
            raise RuntimeError("scorer exploded")
        return Scored(1.0, text[:5])

    task = BenchTask(
        name="custom",
        metric="exact_match",
        samples=[Sample("s0", "one plus one", "2"), Sample("s1", "two plus two", "4")],
        scorer=scorer,
        source="test",
    )
    monkeypatch.setattr("caidllm.bench.runner.load_task", lambda spec, **kw: task)
    report = run_bench(
        BenchConfig(
            model=str(llada_dir),
            tasks=["synthetic:arithmetic"],
            methods=["vanilla"],
            gen_length=16,
            block_length=8,
            batch_size=2,
            out=str(tmp_path),
            warmup=False,
            progress=False,
        ),
        log=lambda message: None,
    )
    (row,) = report["results"]
    assert row["errors"] == 1 and row["accuracy"] == 0.5 and row["n"] == 2
    records = [json.loads(line) for line in (tmp_path / row["samples"]).read_text().splitlines()]
    assert records[0]["error"] is None and "scorer exploded" in records[1]["error"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "nope"], "unknown task 'nope'"),
        (["--task", "synthetic:arithmetic", "--methods", "vanilla,warp"], "unknown method 'warp'"),
        (["--task", "synthetic:arithmetic", "--limit", "0"], "limit must be a positive integer, got 0"),
        (["--task", "synthetic:arithmetic", "--batch-size", "0"], "batch-size must be a positive integer"),
        (
            ["--task", "synthetic:arithmetic", "--gen-length", "20", "--block-length", "8"],
            "multiple of block_length",
        ),
        (["--task", "bbh:missing_task", "--data-dir", str(BENCH)], "missing_task.json"),
        (["--task", "gsm8k", "--data-dir", "/nonexistent/data"], "/nonexistent/data does not exist"),
        (["--task", "synthetic:arithmetic", "--methods", "cai,cai"], "listed twice"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(args, message, llada_dir, capsys):
    code = main(["bench", "--model", str(llada_dir), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_malformed_data_names_the_line(llada_dir, tmp_path, capsys):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    assert main(["bench", "--model", str(llada_dir), "--task", "gsm8k", "--data-dir", str(tmp_path)]) == 2
    assert "test.jsonl line 2 is not valid JSON" in capsys.readouterr().err


def test_unwritable_output_directory(llada_dir, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = main(
        ["bench", "--model", str(llada_dir), "--task", "synthetic:arithmetic", "--out", str(blocker / "x")]
    )
    assert code == 2
    assert "cannot write to output directory" in capsys.readouterr().err


def test_default_data_dir_is_found_from_the_working_directory(tmp_path, monkeypatch):
    from caidllm.bench.datadir import default_data_dir

    project = tmp_path / "main"
    project.mkdir()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    monkeypatch.delenv("CAIDLLM_DATA_DIR", raising=False)
    assert default_data_dir(cwd=project) == (tmp_path / "shared" / "data").resolve()
    monkeypatch.setenv("CAIDLLM_DATA_DIR", str(BENCH))
    assert default_data_dir(cwd=project) == BENCH.resolve()
