"""generate() gives exactly the outputs recorded from the closed-loop engine
(tests/engine_regression.py): token ids, NFE, steps per block, traces, early
stop, for every preset on the tiny model and random LLaDA / Dream (fp32, CPU)."""

import json

import pytest

from engine_regression import RECORD, compute, load_models


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return compute(load_models(tmp_path_factory.mktemp("regression")))


def test_every_preset_matches_the_recorded_outputs(outputs):
    recorded = json.loads(RECORD.read_text())
    assert sorted(outputs) == sorted(recorded)
    for case, rows in recorded.items():
        for i, (want, got) in enumerate(zip(rows, outputs[case])):
            for key, value in want.items():
                assert got[key] == value, f"{case}, prompt {i}: {key} differs"
