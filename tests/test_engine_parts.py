"""The engine's parts (decode/scheduler.py, runner.py, forward_modes.py, models/modes/, the policy registry):
the registries define the valid values, rows group by what they share, the scheduler's limits.
Tiny random LLaDA, fp32 CPU."""

import pytest

from caidllm.decode import build_config, config, forward_modes, policies
from caidllm.decode.engine import Engine
from caidllm.errors import EngineFullError, InputError
from caidllm.models.modes import FORWARD_MODES, MODES, ForwardMode


def small(method, **kw):
    return build_config(method, gen_length=8, block_length=4, early_stop=False, **kw)


def test_the_registries_define_the_valid_values():
    assert config.CACHE_MODES == tuple(forward_modes.CACHE_MODES)
    assert config.POLICIES == tuple(policies.POLICIES)
    assert MODES == tuple(FORWARD_MODES) and all(cls.name == name for name, cls in FORWARD_MODES.items())
    assert all(issubclass(cls, ForwardMode) for cls in FORWARD_MODES.values())
    assert all(
        FORWARD_MODES[mode.between_refreshes.name] is mode.between_refreshes
        for mode in forward_modes.CACHE_MODES.values()
    )
    # a decoder's own forward
    assert {spec.forward for spec in policies.POLICIES.values()} - {None} <= set(MODES)
    with pytest.raises(
        InputError, match="unknown cache mode 'fast'; choose one of " + ", ".join(forward_modes.CACHE_MODES)
    ):
        small("fastdllm", cache="fast")


def test_rows_share_a_policy_call_when_their_own_settings_agree():
    key = policies.policy_key
    # vanilla takes no threshold: rows with other thresholds still share its call
    assert key(small("vanilla", threshold=0.5), True) == key(small("vanilla", threshold=0.9), True)
    assert key(small("fastdllm", threshold=0.5), True) != key(small("fastdllm", threshold=0.9), True)
    assert key(small("cai"), True) != key(small("cai"), False)  # the gating is a setting of cai
    assert key(small("cai"), True) != key(small("cai", theta_end=0.6), True)
    assert key(small("cai"), True) != key(build_config("cai", gen_length=8, block_length=4, steps=4), True)


def test_the_scheduler_groups_by_mode_block_length_and_skip_schedule(llada_lm):
    engine = Engine(llada_lm, max_batch=4)
    for method, kw in [("fastdllm", {}), ("cai", {}), ("es-dllm", {}), ("es-dllm", {"es_alpha": 0.3})]:
        engine.submit([5, 6, 7], small(method, **kw))
    first = engine.scheduler.schedule()  # every block starts with a full forward: one group
    assert [(g.mode, len(g.members)) for g in first] == [("full", 4)]
    engine.step()
    modes = sorted((g.mode, len(g.members)) for g in engine.scheduler.schedule())
    assert modes == [("dual", 2), ("es", 1), ("es", 1)]  # two early-skip schedules cannot share


def test_the_scheduler_holds_max_batch_plus_max_queue_and_refuses_a_known_id(llada_lm):
    engine = Engine(llada_lm, max_batch=1, max_queue=1)
    engine.submit([5, 6], small("vanilla"), request_id="a")
    with pytest.raises(InputError, match="request id 'a' is already in the engine"):
        engine.submit([5, 6], small("vanilla"), request_id="a")
    engine.submit([5, 6], small("vanilla"), request_id="b")
    with pytest.raises(EngineFullError, match="2 requests in flight or queued"):
        engine.submit([5, 6], small("vanilla"))
    engine.step()
    assert (engine.scheduler.in_flight, engine.scheduler.queued) == (1, 1)
    engine.cancel("a")
    assert [event.request_id for event in engine.step()] == ["b"]
