"""Step policies (decode/step_policies.py): which forward groups run at a step. Tokens never
depend on the choice (alone = batched = joining mid-flight, under either policy); "fair" serves
cheap groups more often without starving expensive ones; bad names are refused."""

import random
from types import SimpleNamespace

import pytest

from caidllm.decode import build_config
from caidllm.decode.engine import Engine
from caidllm.decode.step_policies import STEP_POLICIES, AllGroups, FairShare, make_step_policy
from caidllm.errors import InputError

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
LIGHT = dict(method="cai", gen_length=16, block_length=8)
HEAVY = dict(method="vanilla", gen_length=48, block_length=16, early_stop=False)


def group(*ids, mode="full"):
    return SimpleNamespace(
        mode=mode, members=[SimpleNamespace(id=i, slot=k) for k, i in enumerate(ids)], seconds=0.0
    )


def alone(lm, prompt, **settings):
    engine = Engine(lm, max_batch=1)
    rid = engine.submit(prompt, build_config(**settings))
    return {e.request_id: e.result for e in engine.run() if e.finished}[rid]


def charge_by_columns(policy: FairShare):
    """Deterministic costs for the engine tests: a forward costs its rows' canvas columns."""

    def ran(group, seconds):
        FairShare.ran(policy, group, sum(len(r.prompt) + r.layout.span for r in group.members) / 100)

    policy.ran = ran


# ---- the rule, on synthetic groups ------------------------------------------------------


def test_fair_runs_every_tied_group_then_the_least_served():
    policy = FairShare(slice_seconds=10.0)  # no forward cut into rows here
    heavy, light = group("h1", "h2"), group("l")
    assert policy.choose([heavy, light]) == [heavy, light]  # all new: tied, all run
    policy.ran(heavy, 1.0)  # each row is charged its whole forward
    policy.ran(light, 0.15)
    runs = []
    for _ in range(8):
        (chosen,) = policy.choose([heavy, light])
        policy.ran(chosen, 1.0 if chosen is heavy else 0.15)
        runs.append("h" if chosen is heavy else "l")
    assert runs == ["l"] * 6 + ["h", "l"]  # the light one runs until its time passes the heavy forward's
    newcomer = group("n")
    assert policy.choose([heavy, light, newcomer]) == [newcomer]  # starts at the clock, not at 0 ...
    assert policy.virtual["n"] == policy.clock > 0  # ... so it does not overtake by its arrival alone


def test_fair_slices_a_long_forward_into_the_most_owed_rows_that_fit():
    policy = FairShare(slice_seconds=0.25)
    heavy, other = group("h1", "h2", "h3", "h4"), group("x", mode="dual")
    assert policy.choose([heavy]) == [heavy]  # no cost measured yet: the whole forward
    policy.ran(heavy, 1.0)  # 0.25 s a row
    policy.virtual["x"] = 5.0  # another group in flight, served more: the heavy rows run
    (part,) = policy.choose([heavy, other])
    assert [r.id for r in part.members] == ["h1"]
    part.members[0].nfe = 1  # the engine counts each request's forwards
    policy.ran(part, 0.3)
    assert [policy.virtual[f"h{i}"] for i in range(1, 5)] == [
        1.3
    ] * 4  # a slice is charged to its whole group
    (part,) = policy.choose([heavy])  # alone in flight too: a newcomer may arrive during it
    assert [r.id for r in part.members] == ["h2"]  # among equals, the rows that ran least
    policy = FairShare(slice_seconds=0.25)
    cheap, dual, waiting = group("a", "b"), group("a", "b", mode="dual"), group("w", mode="prefix")
    policy.choose([cheap, waiting])
    policy.ran(cheap, 0.2)  # 0.1 s a row: fits, never cut
    policy.virtual["w"] = 5.0
    assert policy.choose([cheap, waiting]) == [cheap] and policy.choose([dual, waiting]) == [dual]  # per mode


def test_fair_slices_reach_every_row_of_a_group_whose_rows_owe_differently():
    """Rows of one group can carry different virtual times (a newcomer joins at the clock, below rows
    served before): a slice is charged to the whole group, so ordering slices by virtual time would run
    the lowest row forever and never the others. Every row runs within a round of slices."""
    policy = FairShare(slice_seconds=0.25)
    heavy = group("h1", "h2", "h3")
    for r in heavy.members:
        r.nfe = 0
    policy.choose([heavy])
    policy.ran(heavy, 0.9)  # 0.3 s a row: one row per slice
    policy.virtual["h1"] -= 0.5  # h1 owes less than the others (say it joined later, at the clock)
    seen = []
    for _ in range(6):
        (part,) = policy.choose([heavy])
        for r in part.members:
            r.nfe += 1
        seen += [r.id for r in part.members]
        policy.ran(part, 0.3)
    assert {"h1", "h2", "h3"} <= set(seen[:3]) and {"h1", "h2", "h3"} <= set(seen[3:])


def test_fair_forgets_requests_that_left():
    policy = FairShare()
    a, b = group("a"), group("b")
    policy.choose([a, b])
    policy.ran(a, 1.0)
    assert policy.choose([b]) == [b] and set(policy.virtual) == {"b"}  # a finished or was cancelled
    assert all(key[0] == "b" for key in policy.row_seconds)
    assert policy.choose([]) == []


@pytest.mark.parametrize("light_cost", [0.001, 0.01, 0.2])
def test_no_starvation_under_a_stream_of_light_requests(light_cost):
    """A heavy request beside 7 light ones, each replaced by a new one as it finishes (6 forwards):
    between two runs of the heavy one, each slot is served at most twice (heavy + largest forward)
    seconds (its request, and the newcomer that replaced it), and the heavy one gets at least about
    its fair share of the time."""
    policy, rng = FairShare(), random.Random(0)
    heavy_cost, slots = 1.0, 8
    lights = {f"l{i}": 0 for i in range(slots - 1)}
    served_since, heavy_time, total, fresh = 0.0, 0.0, 0.0, slots
    for _ in range(3000):
        groups = [group("heavy")] + [group(i) for i in lights]
        for chosen in policy.choose(groups):
            rid = chosen.members[0].id
            cost = heavy_cost if rid == "heavy" else light_cost * rng.uniform(0.5, 1.5)
            policy.ran(chosen, cost)
            total += cost
            if rid == "heavy":
                assert served_since <= 2 * (slots - 1) * (heavy_cost + 1.5 * light_cost) + 1e-9
                served_since, heavy_time = 0.0, heavy_time + cost
            else:
                served_since += cost
                lights[rid] += 1
                if lights[rid] == 6:  # finished: a new light request takes the slot
                    del lights[rid]
                    lights[f"l{fresh}"], fresh = 0, fresh + 1
    assert heavy_time / total >= 1 / slots - 0.02


def test_all_runs_every_group():
    groups = [group("a"), group("b", "c")]
    assert AllGroups().choose(groups) == groups


@pytest.mark.parametrize("name", ["nope", "", 1, "FAIR"])  # None: the engine's default (fair)
def test_an_unknown_step_policy_is_refused(name, llada_lm):
    with pytest.raises(InputError, match=r"unknown step policy .*; choose one of fair, all"):
        make_step_policy(name)
    with pytest.raises(InputError, match="unknown step policy"):
        Engine(llada_lm, step_policy=name)


def test_the_default_is_fair(llada_lm):
    assert Engine(llada_lm).scheduler.step_policy.name == "fair" and set(STEP_POLICIES) == {"fair", "all"}


# ---- in the engine ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fair", "all"])
def test_tokens_do_not_depend_on_the_policy(llada_lm, policy):
    """Heavy and light requests together, one light joining mid-flight, one cancelled: each
    finished one equals its run alone (tokens, NFE and commit steps exactly). Under "fair" with
    these costs the heavy forward is sliced too (0.5 s a row past the 0.25 s slice)."""
    engine = Engine(llada_lm, max_batch=4, step_policy=policy)
    if policy == "fair":
        charge_by_columns(engine.scheduler.step_policy)
    heavy = engine.submit(PROMPTS[0], build_config(**HEAVY))
    light = engine.submit(PROMPTS[1], build_config(**LIGHT))
    dropped = engine.submit(PROMPTS[2], build_config(**HEAVY))
    engine.step()
    engine.step()
    engine.cancel(dropped)
    late = engine.submit(PROMPTS[2], build_config(**LIGHT))
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert set(results) == {heavy, light, late}
    for rid, prompt, settings in (
        (heavy, PROMPTS[0], HEAVY),
        (light, PROMPTS[1], LIGHT),
        (late, PROMPTS[2], LIGHT),
    ):
        want = alone(llada_lm, prompt, **settings)
        got = results[rid]
        assert (got.token_ids, got.nfe, got.trace.commit_step) == (
            want.token_ids,
            want.nfe,
            want.trace.commit_step,
        )
    engine.scheduler.schedule()  # nothing in flight: the policy forgets who left
    assert not getattr(engine.scheduler.step_policy, "virtual", {})


def test_fair_steps_a_light_request_more_often_than_all(llada_lm):
    """The light request's steps are not paced by the heavy one's under "fair": it finishes within
    fewer engine steps that ran the heavy forward; the heavy one still advances (no starvation)."""

    def heavy_runs_during_light(policy):
        engine = Engine(llada_lm, max_batch=4, step_policy=policy)
        if policy == "fair":
            charge_by_columns(engine.scheduler.step_policy)
        heavy = engine.submit(PROMPTS[0], build_config(**HEAVY))
        engine.step()
        light = engine.submit(PROMPTS[1], build_config(**LIGHT))
        count, done = 0, False
        while not done:
            events = engine.step()
            count += any(e.request_id == heavy for e in events)
            done = any(e.request_id == light and e.finished for e in events)
        rest = {e.request_id: e.result for e in engine.run() if e.finished}
        assert heavy in rest  # it finished too
        return count

    under_all, under_fair = heavy_runs_during_light("all"), heavy_runs_during_light("fair")
    assert under_fair < under_all


def test_early_stop_and_a_single_request_run_every_step(llada_lm):
    """Alone, a request runs at every step under "fair" (nothing else is owed time)."""
    engine = Engine(llada_lm, max_batch=2)
    rid = engine.submit(PROMPTS[0], build_config(**LIGHT))
    events = list(engine.run())
    assert engine.steps == len(events) == events[-1].result.nfe and events[-1].request_id == rid


def test_a_tensor_parallel_model_steps_every_group(llada_lm):
    """Its ranks replay rank 0's steps and must run the same groups: "fair" reads each rank's clock."""
    from caidllm.decode.engine import tp_step_policy

    sharded = SimpleNamespace(tp=object())
    assert tp_step_policy(sharded, None) == tp_step_policy(sharded, "all") == "all"
    with pytest.raises(InputError, match="does not apply to a tensor-parallel model"):
        tp_step_policy(sharded, "fair")
    assert tp_step_policy(llada_lm, None) == "fair" and tp_step_policy(llada_lm, "all") == "all"
