"""Commit policies on hand-made confidence tensors (no model needed)."""

import math

import pytest
import torch

from caidllm.decode import CAISettings, build_config
from caidllm.decode.policies import StepView, cai, threshold, vanilla
from caidllm.errors import InputError


def make_view(confidence, masked=None, first=None, step=0, total_steps=64, block_index=0, state=None):
    confidence = torch.as_tensor(confidence, dtype=torch.float32)
    if confidence.dim() == 1:
        confidence = confidence[None]
    masked = torch.ones_like(confidence, dtype=torch.bool) if masked is None else torch.as_tensor(masked)
    first = (
        confidence.clone()
        if first is None
        else torch.as_tensor(first, dtype=torch.float32).reshape(confidence.shape)
    )
    rows = torch.arange(confidence.shape[0])
    return StepView(
        confidence=confidence,
        predicted=torch.zeros_like(confidence, dtype=torch.long),
        masked=masked,
        first_confidence=first,
        step=step,
        total_steps=total_steps,
        block_index=block_index,
        rows=rows,
        state=state if state is not None else {},
    )


# --- Box 3 / Box 4: thresholds -------------------------------------------------------------


def box3(t, T, theta_s=0.90, theta_e=0.70, w=0.15):
    if t < w * T:
        return theta_s
    u = (t - w * T) / (T - w * T)
    return theta_e + (theta_s - theta_e) / 2 * (1 + math.cos(math.pi * u))


@pytest.mark.parametrize("T", [20, 40, 64])
def test_cosine_schedule_matches_box3(T):
    s = CAISettings()
    wT = 0.15 * T
    for t in sorted({0, math.ceil(wT), T // 2, T - 1}):
        assert cai.block_threshold(t, T, 0, s) == pytest.approx(box3(t, T), abs=1e-12)
    assert cai.block_threshold(0, T, 0, s) == pytest.approx(0.90)
    assert cai.block_threshold(T // 2, T, 0, s) < 0.90
    assert cai.block_threshold(T - 1, T, 0, s) == pytest.approx(0.70, abs=0.01)


def test_cosine_schedule_exact_points():
    # T = 20 puts wT = 3 on a step: theta(wT) = theta_s, theta(T/2) and theta(T-1) by hand.
    s = CAISettings()
    assert cai.block_threshold(0, 20, 0, s) == pytest.approx(0.90)
    assert cai.block_threshold(3, 20, 0, s) == pytest.approx(0.90)
    assert cai.block_threshold(10, 20, 0, s) == pytest.approx(0.70 + 0.10 * (1 + math.cos(math.pi * 7 / 17)))
    assert cai.block_threshold(19, 20, 0, s) == pytest.approx(0.70 + 0.10 * (1 + math.cos(math.pi * 16 / 17)))
    assert cai.block_threshold(2, 20, 0, s) == pytest.approx(0.90)  # still in warm-up


def test_block_end_thresholds_blocks_1_to_6():
    s = CAISettings()
    got = [cai.block_end_threshold(b, s) for b in range(6)]
    assert got == pytest.approx([0.70, 0.60, 0.50, 0.40, 0.40, 0.40])
    assert cai.block_threshold(63, 64, 3, s) == pytest.approx(0.40, abs=0.01)
    low = CAISettings(theta_end=0.30)  # an end threshold set below the floor is kept, not raised
    assert [cai.block_end_threshold(b, low) for b in range(3)] == pytest.approx([0.30, 0.30, 0.30])
    flat = CAISettings(block_schedule=False)
    assert [cai.block_end_threshold(b, flat) for b in range(6)] == pytest.approx([0.70] * 6)


def test_position_factors_and_clipping():
    s = CAISettings()
    factors = cai.position_factors(64, s)
    assert factors.tolist() == pytest.approx([0.80] * 16 + [0.90] * 16 + [1.05] * 16 + [1.10] * 16)
    assert cai.position_factors(8, s).tolist() == pytest.approx(
        [0.80] * 2 + [0.90] * 2 + [1.05] * 2 + [1.10] * 2
    )
    high = cai.token_thresholds(0.90, 64, s)
    assert high[0] == pytest.approx(0.72) and high[20] == pytest.approx(0.81)
    assert high[40] == pytest.approx(0.945) and high[63] == pytest.approx(0.98)  # 0.99 clipped
    low = cai.token_thresholds(0.22, 64, s)
    assert low[0] == pytest.approx(0.20)  # 0.176 clipped up
    assert cai.token_thresholds(0.9, 64, CAISettings(position_factors=False)).tolist() == pytest.approx(
        [0.9] * 64
    )


# --- Box 5: budgets ----------------------------------------------------------------------


def test_budget_levels_by_confidence_and_position():
    s = CAISettings()
    first = torch.tensor([[0.9, 0.9, 0.3, 0.1, 0.9, 0.3, 0.6, 0.9]])  # block of 8: quarters of 2
    b = cai.budgets(first, 64, s)
    # p<half & s>.5 -> 8; s<.25 or last quarter -> 64; else 32
    assert b.tolist() == [[8, 8, 32, 64, 32, 32, 64, 64]]


def _run_cai(conf_per_step, first, steps, gating=True, total_steps=64, block_index=0):
    """Drive the CAI policy like the engine: commit, update the mask. Returns the step
    at which each position was committed (-1 = never)."""
    n = first.shape[-1]
    masked = torch.ones((1, n), dtype=torch.bool)
    committed_at = torch.full((n,), -1)
    state = {"low_yield_steps": torch.zeros(1, dtype=torch.long)}
    for t in range(steps):
        view = make_view(
            conf_per_step(t),
            masked=masked.clone(),
            first=first,
            step=t,
            total_steps=total_steps,
            block_index=block_index,
            state=state,
        )
        commit = cai.select(view, CAISettings(), gating=gating, fixed_threshold=0.9) & masked
        assert commit.any() or not masked.any(), "at least one commit per step"
        committed_at[commit[0]] = t
        masked &= ~commit
    return committed_at


def test_budget_forces_commit_at_exactly_B_i():
    # Position 0: easy (s=0.9, first half) -> B=8. Position 1: s=0.3 in the first half -> B=32.
    # Their confidence stays tiny; decoys (one commits per step) keep the rest busy.
    n = 64
    first = torch.full((1, n), 0.3)
    first[0, 0] = 0.9

    def conf(t):
        c = torch.linspace(0.39, 0.30, n)  # decoys, below every threshold and the fallback
        c[0] = 0.01
        c[1] = 0.01
        return c

    committed_at = _run_cai(conf, first, steps=40)
    assert committed_at[0] == 8
    assert committed_at[1] == 32


def test_budgets_inactive_without_gating():
    n = 64
    first = torch.full((1, n), 0.9)
    committed_at = _run_cai(lambda t: torch.full((n,), 0.01), first, steps=20, gating=False)
    assert (committed_at >= 0).sum() == 20  # only the at-least-one rule commits


def test_grinding_fires_after_exactly_K_low_yield_steps():
    # Positions 16..: s = 0.3 (normal / hard budgets, not reached). Decoys at 0.60 .. 0.50 win
    # the at-least-one rule one per step; A (0.45) is above the fallback 0.40, C (0.39) below.
    n = 64
    first = torch.full((1, n), 0.3)
    conf = torch.full((n,), 0.05)
    conf[16:26] = torch.linspace(0.60, 0.50, 10)
    A, C = 30, 31
    conf[A], conf[C] = 0.45, 0.39
    committed_at = _run_cai(lambda t: conf, first, steps=6)
    assert committed_at[16:20].tolist() == [0, 1, 2, 3]  # one per step: low-yield (< 1.5)
    assert committed_at[A] == 3  # the 4th low-yield step (K = 4) triggers the fallback
    assert (committed_at[20:26] == 3).all()
    assert committed_at[C] == -1 or committed_at[C] > 3  # 0.39 is never force-committed by grinding
    assert (committed_at[(conf <= 0.40)] != 3).all()


def test_grinding_exit_commits_every_masked_position_at_the_Kth_low_yield_step():
    # Same case as above with grinding_action="exit": the 4th low-yield step commits the whole block,
    # the 0.39 token and the 0.05 ones included; the "continue" steps before it are unchanged.
    n = 64
    first = torch.full((1, n), 0.3)
    conf = torch.full((n,), 0.05)
    conf[16:26] = torch.linspace(0.60, 0.50, 10)
    conf[30], conf[31] = 0.45, 0.39
    s = CAISettings(grinding_action="exit")
    state = {"low_yield_steps": torch.zeros(1, dtype=torch.long)}
    masked = torch.ones(1, n, dtype=torch.bool)
    for t in range(3):
        commit = cai.select(
            make_view(conf, masked=masked.clone(), first=first, step=t, state=state),
            s,
            gating=True,
            fixed_threshold=0.9,
        )
        assert commit.sum() == 1  # low-yield: no exit yet
        masked &= ~commit
    commit = cai.select(
        make_view(conf, masked=masked.clone(), first=first, step=3, state=state),
        s,
        gating=True,
        fixed_threshold=0.9,
    )
    assert commit[0].equal(masked[0])  # every position still masked, nothing already committed
    assert int(commit.sum()) == n - 3


def test_grinding_exit_only_for_rows_that_grind():
    # Row 0 has been low-yield 3 steps (one more triggers), row 1 none: only row 0 exits.
    conf = torch.full((2, 8), 0.05)
    state = {"low_yield_steps": torch.tensor([3, 0])}
    commit = cai.select(
        make_view(conf, first=torch.full((2, 8), 0.3), step=5, state=state),
        CAISettings(grinding_action="exit"),
        gating=True,
        fixed_threshold=0.9,
    )
    assert commit[0].all() and int(commit[1].sum()) == 1
    assert state["low_yield_steps"].tolist() == [0, 1]


def test_cai_commits_above_position_threshold():
    # Step 0 of block 1: theta_b = 0.90; first quarter threshold 0.72, last quarter 0.98.
    conf = torch.full((64,), 0.80)
    view = make_view(
        conf, first=torch.full((1, 64), 0.8), state={"low_yield_steps": torch.zeros(1, dtype=torch.long)}
    )
    commit = cai.select(view, CAISettings(), gating=False, fixed_threshold=0.9)[0]
    assert commit[:16].all() and not commit[16:].any()


def test_cai_fixed_threshold_when_not_adaptive():
    conf = torch.tensor([0.95, 0.91, 0.85, 0.5])
    s = CAISettings(adaptive=False, position_factors=False)
    view = make_view(conf, state={"low_yield_steps": torch.zeros(1, dtype=torch.long)})
    assert cai.select(view, s, gating=False, fixed_threshold=0.9)[0].tolist() == [True, True, False, False]


# --- baselines ----------------------------------------------------------------------------


def test_vanilla_linear_schedule():
    assert [int(vanilla.tokens_at_step(torch.tensor(10), t, 4)) for t in range(4)] == [3, 3, 2, 2]
    conf = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.2], [0.3, 0.3, 0.3, 0.3, 0.3]])
    state = {"n_masked": torch.zeros(2, dtype=torch.long)}
    view = make_view(conf, step=0, total_steps=2, state=state)  # n=5, T=2 -> 3 then 2
    commit = vanilla.select(view)
    assert commit[0].tolist() == [False, True, True, True, False]
    assert commit[1].tolist() == [True, True, True, False, False]  # ties: leftmost first


def test_threshold_rule_and_at_least_one():
    conf = torch.tensor([[0.95, 0.5, 0.91, 0.2], [0.3, 0.6, 0.1, 0.2]])
    commit = threshold.select(make_view(conf), threshold=0.9)
    assert commit.tolist() == [[True, False, True, False], [False, True, False, False]]
    masked = torch.tensor([[False, True, True, True], [True, True, True, True]])
    commit = threshold.select(make_view(conf, masked=masked), threshold=0.9)
    assert commit[0].tolist() == [False, False, True, False]  # never a committed position


def test_threshold_one_commits_one_token_per_step():
    conf = torch.rand(3, 16) * 0.999
    commit = threshold.select(make_view(conf), threshold=1.0)
    assert commit.sum(dim=1).tolist() == [1, 1, 1]


def test_factor_rule():
    # n-th highest must be >= 1 - f/(n+1); f = 1: 0.5, 0.667, 0.75, 0.8 ...
    conf = torch.tensor([[0.9, 0.7, 0.6, 0.95]])
    commit = threshold.select(make_view(conf), threshold=0.9, factor=1.0)
    # sorted: 0.95 >= .5, 0.9 >= .667, then 0.7 < .75 stops the prefix
    assert commit[0].tolist() == [True, False, False, True]
    assert threshold.select(make_view(conf), threshold=0.9, factor=2.0)[0].tolist() == [
        True,
        True,
        True,
        True,
    ]


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gen_length=100, block_length=64), "multiple of block_length"),
        (dict(gen_length=0), "gen_length must be a positive integer"),
        (dict(block_length=-4), "block_length must be a positive integer"),
        (dict(threshold=0.0), r"threshold must be in \(0, 1\]"),
        (dict(threshold=1.5), r"threshold must be in \(0, 1\]"),
        (dict(steps=0), "steps must be a positive integer"),
        (dict(gen_length=128, block_length=64, steps=3), "multiple of the number of blocks"),
        (dict(cache="triple"), "unknown cache mode 'triple'"),
        (dict(temperature=-1.0), "temperature must be"),
        (dict(theta_start=2.0), r"cai.theta_start must be in \(0, 1\]"),
        (dict(nonsense=1), "unknown decoding option 'nonsense'"),
        (dict(temperature=float("inf")), "temperature must be a finite number"),
        (dict(refresh_every=True), "refresh_every must be an integer"),
        (dict(factors=0.8), "cai.factors must be four positive numbers"),
        (dict(factors=(0.8, 0.9, "x", 1.1)), "cai.factors must be four positive numbers"),
        (dict(grinding_patience="4"), "cai.grinding_patience must be an integer"),
        (dict(grinding_yield="1.5"), "cai.grinding_yield must be a number"),
        (dict(block_end_decay=-0.1), "cai.block_end_decay must be a number >= 0"),
        (dict(warmup="0.1"), r"cai.warmup must be in \[0, 1\)"),
        (dict(gating="yes"), "cai.gating must be True, False or None"),
        (dict(grinding_action="stop"), "cai.grinding_action must be one of continue, exit, got 'stop'"),
    ],
)
def test_bad_config_values(kwargs, message):
    with pytest.raises(InputError, match=message):
        build_config("cai", **kwargs)


def test_unknown_method():
    with pytest.raises(InputError, match="unknown method 'fast'"):
        build_config("fast")


def test_presets_and_overrides():
    assert build_config("vanilla").cache == "none"
    fd = build_config("fastdllm", cache="none")
    assert fd.policy == "threshold" and fd.cache == "none" and fd.policy_settings.threshold == 0.9
    assert build_config("cai-gate-off").policy_settings.gating is False
    assert build_config("cai-gate-on").policy_settings.gating is True
    assert build_config("cai").policy_settings.gating is None
    assert build_config("cai-exit").policy_settings.grinding_action == "exit"
    assert build_config("cai", gating=False, cai={"theta_start": 0.8}).policy_settings.theta_start == 0.8
    assert build_config("cai", gen_length=128, block_length=32).steps_per_block == 32
    assert build_config("vanilla", gen_length=128, block_length=32, steps=64).steps_per_block == 16


def test_every_policy_name_has_a_builder_and_unknown_names_are_refused():
    from dataclasses import replace

    from caidllm.decode.config import POLICIES
    from caidllm.decode.policies import POLICIES as REGISTRY
    from caidllm.decode.policies import make_policy

    assert sorted(REGISTRY) == sorted(POLICIES)
    policy, state = make_policy(build_config("vanilla"), gating=True)
    assert policy is vanilla.select and state == ("n_masked",)
    with pytest.raises(InputError, match="unknown policy 'turbo'"):
        # past validate(): no CAI fallback
        make_policy(replace(build_config("cai"), policy="turbo"), gating=True)
