"""caidllm calibrate: the selection rule on made-up numbers, the search's bounds and determinism, and one
tiny run end to end (a few samples, a budget of a few settings)."""

import pytest

from caidllm.bench.calibrate import SEARCH_SPACE, Trial, better, choose, coordinate_search, floor_of
from caidllm.bench.calibrate_run import CalibrateOptions, run_calibrate
from caidllm.cli import main
from caidllm.decode.settings_file import load_settings


def trial(label, accuracy, nfe, wall=1.0):
    return Trial(label, {}, accuracy=accuracy, nfe=nfe, wall_s=wall)


def test_selection_rule_on_made_up_numbers():
    floor = floor_of(0.80, 1.0)  # vanilla 80%, one point allowed: 79%
    assert floor == pytest.approx(0.79)
    start, faster_ok = trial("s", 0.80, 10), trial("a", 0.79, 6)
    faster_bad, slower = trial("b", 0.78, 3), trial("c", 0.9, 12)
    assert better(faster_ok, start, floor, "nfe")  # at the floor exactly, and cheaper
    assert not better(faster_bad, start, floor, "nfe")  # cheaper but under the floor
    assert not better(slower, start, floor, "nfe")  # more accurate but slower: speed is the objective
    assert not better(trial("tie", 0.95, 10), start, floor, "nfe")  # a tie keeps the earlier
    assert better(trial("w", 0.80, 20, wall=0.5), start, floor, "wall")  # the wall objective reads wall_s
    # both under: more accurate wins
    assert better(trial("any", 0.70, 50), trial("worse", 0.60, 1), floor, "nfe")
    assert (
        choose([start, faster_bad, faster_ok, slower, trial("late tie", 0.85, 6)], floor, "nfe") is faster_ok
    )
    # none feasible: the most accurate
    assert choose([faster_bad, trial("d", 0.5, 1)], floor, "nfe") is faster_bad


def fake_evaluate(calls):
    """A made-up landscape: lower theta_end is faster; accuracy falls below theta_end 0.6."""

    def evaluate(label, values):
        calls.append(label)
        nfe = 10 * values["theta_end"] + (2 if values["gating"] else 0) + values["warmup"]
        accuracy = 0.8 if values["theta_end"] >= 0.6 else 0.7
        return Trial(label, dict(values), accuracy=accuracy, nfe=nfe, wall_s=0.0)

    return evaluate


START = {"theta_end": 0.7, "warmup": 0.15, "gating": True, "grinding_patience": 4}


def test_search_finds_the_fastest_feasible_point_within_its_budget():
    calls = []
    trials = coordinate_search(dict(START), fake_evaluate(calls), budget=50, floor=0.79)
    best = choose(trials, 0.79, "nfe")
    assert best.values["theta_end"] == 0.6 and best.values["gating"] is False and best.values["warmup"] == 0.0
    assert len(calls) == len(trials) <= 50 and calls[0] == "start"
    # With gating off the gated settings change nothing: never decoded with gating off.
    assert not any(t.values["gating"] is False and t.label.startswith("grinding_patience") for t in trials)
    assert len(coordinate_search(dict(START), fake_evaluate([]), budget=3, floor=0.79)) == 3


def test_search_is_deterministic_given_the_seed():
    def labels(seed):
        return [t.label for t in coordinate_search(dict(START), fake_evaluate([]), 6, 0.79, seed=seed)]

    assert labels(0) == labels(0)
    assert any(labels(0) != labels(s) for s in range(1, 6))  # the seed orders the values tried


def test_tiny_calibration_end_to_end_is_deterministic(tmp_path):
    import caidllm

    lm = caidllm.load("tiny", device="cpu", dtype="float32")
    runs = []
    for i in range(2):
        options = CalibrateOptions(
            tasks=["synthetic:boolean_expressions"],
            out=str(tmp_path / f"s{i}.json"),
            limit=2,
            budget=3,
            gen_length=32,
            block_length=16,
            progress=False,
        )
        runs.append(run_calibrate(options, lm=lm, log=lambda m: None))
    a, b = ([(t.label, t.accuracy, t.nfe) for t in r["trials"]] for r in runs)
    assert a == b and len(a) == 3 and a[0][0] == "start"
    settings = load_settings(tmp_path / "s0.json")
    assert set(settings.values["cai"]) == set(SEARCH_SPACE) and settings.method == "cai"
    calibration = settings.calibration
    assert calibration["held_out"]["synthetic:boolean_expressions"]["ids"] == [
        "synthetic:boolean_expressions/validation/0",
        "synthetic:boolean_expressions/validation/1",
    ]
    assert len(calibration["search"]) == 3 and calibration["vanilla"]["label"] == "vanilla"
    assert "| 0 | vanilla |" in (tmp_path / "s0.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "bbh:web_of_lies", "--data-dir", "/work/none"], "need --holdout START:END"),
        (
            ["--task", "bbh:web_of_lies", "--holdout", "9:3", "--data-dir", "/work/none"],
            "--holdout must be START:END",
        ),
        (["--task", "synthetic:arithmetic", "--method", "vanilla"], "does not run the CAI controller"),
        (["--task", "synthetic:arithmetic", "--budget", "0"], "budget must be a positive integer"),
        (["--task", "synthetic:arithmetic", "--max-loss", "-1"], "max-loss must be a number"),
        (["--task", "nope"], "unknown task 'nope'"),
        ([], "no task given"),
    ],
)
def test_bad_input_exits_2(args, message, tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "s.json"), *args]) == 2
    assert message in capsys.readouterr().err
