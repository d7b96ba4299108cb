"""The arrival benchmark runs end to end (its figures are measured, never asserted)."""

import json

from caidllm.bench.arrivals import main, percentile, poisson_arrivals


def test_arrivals_benchmark_runs(tmp_path, capsys):
    out = tmp_path / "arrivals.json"
    assert (
        main(
            [
                "--requests",
                "6",
                "--methods",
                "fastdllm",
                "--max-batch",
                "2",
                "--gen-length",
                "32",
                "--block-length",
                "16",
                "--rate",
                "40",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "| fastdllm | continuous |" in table and "| fastdllm | static |" in table
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        assert row["throughput_tok_s"] > 0 and row["latency_p99_s"] >= row["latency_mean_s"] * 0.5
        assert 0 < row["ttft_mean_s"] <= row["latency_mean_s"]


def test_arrivals_are_seeded_and_percentiles_are_nearest_rank():
    assert poisson_arrivals(5, 2.0, seed=1) == poisson_arrivals(5, 2.0, seed=1)
    assert poisson_arrivals(5, 2.0, seed=1) != poisson_arrivals(5, 2.0, seed=2)
    assert percentile(list(range(1, 101)), 99) == 99 and percentile([3.0], 99) == 3.0
