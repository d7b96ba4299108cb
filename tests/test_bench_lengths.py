"""`caidllm bench --lengths`: the length table in one command on `tiny` (tiny lengths, --limit 2): the table,
the plot and the JSON in the output folder, the expected time said before the run; refusals (a length not a
multiple of the block, a decoder setting out of range) exit 2 before anything runs; a run that fails midway
leaves nothing in the output folder."""

import json

import pytest

from caidllm.bench import length_budget
from caidllm.bench import lengths as lengths_module
from caidllm.bench.lengths import parse_lengths
from caidllm.cli import main
from caidllm.errors import InputError

SMALL = [
    "--model",
    "tiny",
    "--task",
    "synthetic:boolean_expressions",
    "--limit",
    "2",
    "--batch-size",
    "2",
    "--methods",
    "vanilla,cai",
    "--block-length",
    "8",
    "--no-progress",
]


def test_the_length_table_in_one_command(tmp_path, capsys):
    out = tmp_path / "lengths"
    assert main(["bench", *SMALL, "--lengths", "16,8", "--out", str(out)]) == 0
    assert "2 examples: expected at most ~" in capsys.readouterr().err  # said before the run starts
    assert sorted(p.name for p in out.iterdir()) == ["lengths.png", "results.json", "results.md"]
    report = json.loads((out / "results.json").read_text())
    assert report["lengths"] == [8, 16] and report["block_length"] == 8
    cells = {(r["method"], r["gen_length"]): r for r in report["rows"]}
    assert set(cells) == {(m, n) for m in ("vanilla", "cai") for n in (8, 16)}
    assert cells[("vanilla", 16)]["nfe"] == 16 and cells[("vanilla", 8)]["nfe"] == 8
    assert all(cells[("vanilla", n)]["speedup"] == 1.0 for n in (8, 16))  # the baseline at every length
    for n in (8, 16):  # speedup = tokens/s over vanilla's at the same length
        assert cells[("cai", n)]["speedup"] == pytest.approx(
            cells[("cai", n)]["tps"] / cells[("vanilla", n)]["tps"]
        )
    table = (out / "results.md").read_text()
    assert "| method | 8 tokens | 16 tokens |" in table and "| cai |" in table
    accuracy = f"{100 * cells[('cai', 16)]['accuracy']:.1f}%"  # accuracy beside the speed in each cell
    assert f"{cells[('cai', 16)]['tps']:.1f} tok/s (" in table and f"fwd, {accuracy})" in table


@pytest.mark.parametrize(
    "text, words",
    [
        ("16,12", "12 is not a positive multiple of the block length 8"),
        ("0", "0 is not a positive multiple"),
        ("16,x", "comma-separated integers"),
        (",", "names no length"),
    ],
)
def test_a_bad_length_list_is_refused_by_name(text, words):
    with pytest.raises(InputError, match=words) as error:
        parse_lengths(text, 8)
    assert error.value.field == "lengths"


def test_refusals_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "lengths"
    assert main(["bench", *SMALL, "--lengths", "8,12", "--out", str(out)]) == 2
    settings = tmp_path / "bad.json"
    settings.write_text(json.dumps({"caidllm_settings": 1, "method": "cai", "cai": {"theta_end": 1.5}}))
    assert main(["bench", *SMALL, "--lengths", "8", "--settings", str(settings), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--lengths: 12 is not a positive multiple" in err and "cai.theta_end must be in (0, 1]" in err
    assert "expected at most" not in err  # refused before the model loads and the run starts
    assert not out.exists()


def test_a_run_that_fails_midway_leaves_nothing_half_written(tmp_path, monkeypatch):
    out = tmp_path / "lengths"
    calls = []

    def failing_plot(*args):
        calls.append(args)
        raise RuntimeError("disk full")

    monkeypatch.setattr(lengths_module, "plot", failing_plot)  # the last file written fails
    with pytest.raises(RuntimeError):
        main(["bench", *SMALL, "--lengths", "8", "--out", str(out)])
    assert calls and not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "measured, words",
    [
        (7200.0, "expected ~2.0 h (each method's first batch at 16 tokens, for every batch and length)"),
        (7200.0, "on 2 examples per task, past --max-hours 1; give --limit 1 or less, or raise --max-hours"),
        (1e9, "pick shorter --lengths or fewer --methods"),
    ],
)
def test_a_run_past_the_bound_is_refused_before_it_decodes(tmp_path, capsys, monkeypatch, measured, words):
    # The forward's upper bound (10 h) is past the budget: the first batches are timed (here: stated).
    out = tmp_path / "lengths"
    decoded = []
    monkeypatch.setattr(length_budget, "upper_bound", lambda *args: 36000.0)
    monkeypatch.setattr(length_budget, "first_batches", lambda lm, settings, n: measured / 2 / 2)
    monkeypatch.setattr("caidllm.bench.runner.run_bench", lambda *a, **k: decoded.append(a))
    assert main(["bench", *SMALL, "--lengths", "8,16", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the upper bound is ~10.0 h; timing each method's first batch at 16" in err and words in err
    assert not decoded and not out.exists() and list(tmp_path.iterdir()) == []


def test_the_first_batches_decide_when_the_upper_bound_is_past_the_budget(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(length_budget, "upper_bound", lambda *args: 36000.0)  # really timed below
    out = tmp_path / "lengths"
    assert main(["bench", *SMALL, "--lengths", "8,16", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "timing each method's first batch at 16" in err
    assert "2 examples: expected at most ~" in err and "(each method's first batch at 16 tokens" in err
    report = json.loads((out / "results.json").read_text())
    assert 0 < report["expected_s"] < 3600


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--lengths", "8", "--max-hours", "0"], "--max-hours must be a positive number of hours, got 0"),
        (["--lengths", "8", "--max-hours", "nan"], "--max-hours must be a positive number of hours"),
        (["--max-hours", "2"], "--max-hours applies to --lengths only"),
        (["--lengths", "8", "--prefix-cache-mb", "0,256"], "--lengths takes one --prefix-cache-mb budget"),
    ],
)
def test_a_bad_max_hours_is_refused(tmp_path, capsys, argv, words):
    out = tmp_path / "lengths"
    assert main(["bench", *SMALL, *argv, "--out", str(out)]) == 2
    assert words in capsys.readouterr().err and not out.exists()


def test_a_generous_bound_lets_the_run_go(tmp_path, monkeypatch):
    monkeypatch.setattr(length_budget, "upper_bound", lambda *args: 7200.0)
    monkeypatch.setattr(length_budget, "first_batches", lambda *args: pytest.fail("timed a batch"))
    out = tmp_path / "lengths"
    argv = ["bench", *SMALL, "--methods", "vanilla", "--lengths", "8", "--max-hours", "2.5"]
    assert main([*argv, "--out", str(out)]) == 0
    assert (out / "lengths.png").exists()
