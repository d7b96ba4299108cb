"""generate() gives exactly the outputs recorded from the closed-loop engine
(tests/engine_regression.py): token ids, NFE, steps per block, traces, early
stop, for every preset on the tiny model and random LLaDA / Dream (fp32, CPU). Token ids, texts, NFE,
steps and commit steps exactly; confidences and computed fractions to 1e-4 relative (their last bits
depend on the CPU's kernels)."""

import json

import pytest

from engine_regression import RECORD, compute, differences, load_models


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return compute(load_models(tmp_path_factory.mktemp("regression")))


def test_every_preset_matches_the_recorded_outputs(outputs):
    recorded = json.loads(RECORD.read_text())
    assert sorted(outputs) == sorted(recorded)
    for case, rows in recorded.items():
        for i, (want, got) in enumerate(zip(rows, outputs[case])):
            assert not differences(want, got), (
                f"{case}, prompt {i}: {', '.join(differences(want, got))} differ(s)"
            )


def test_floats_are_compared_to_a_tolerance_and_the_rest_exactly():
    recorded = json.loads(RECORD.read_text())
    want = recorded["llada/vanilla"][0]
    assert not differences(want, want)
    close = dict(
        want, first_confidence=[None if c is None else c * (1 + 3e-7) for c in want["first_confidence"]]
    )
    assert not differences(want, close)  # the case: 0.03903884440660477 vs 0.03903883323073387
    far = dict(
        want, first_confidence=[None if c is None else c * (1 + 1e-2) for c in want["first_confidence"]]
    )
    assert differences(want, far) == ["first_confidence"]
    moved = dict(want, token_ids=want["token_ids"][::-1], nfe=want["nfe"] + 1)
    assert differences(want, moved) == ["token_ids", "nfe"]
