"""Under --tp, rank 0's UniformEngine sends the other ranks its inputs (parallel/mirror.py): here the
messages go through a list instead of gloo, and a follower replays them on its own engine over the same
model, comparing each step's commits with rank 0's digest. Cancel, cancel_all and drop_running between
steps must reach it (a request left running on the follower commits what rank 0 does not: RanksDiverged)."""

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers.models.diffusion_gemma")

from caidllm.decode.diffusiongemma_settings import build_settings
from caidllm.decode.uniform_engine import UniformEngine
from caidllm.parallel import mirror as mirror_module
from helpers.dg_reference import engine_lm, reference

KNOBS = dict(gen_length=16, max_denoising_steps=3, adaptive_stop=False, stream_draft=True)


def _leader(monkeypatch, lm):
    sent: list = []
    monkeypatch.setattr(mirror_module, "broadcast", lambda tp, ops: sent.append(ops) or ops)
    tp = SimpleNamespace(rank=0, size=2, group="g", control="g")  # one group: no keep-alive thread
    lm.mirror = mirror_module.Mirror(tp)
    return sent


def _replay(monkeypatch, lm, sent) -> list:
    """The follower's engines after replaying every message (follow() until "stop")."""
    made = []
    real = mirror_module.engine_class

    def make(m):
        return lambda *a, **k: made.append(real(m)(*a, **k)) or made[-1]

    monkeypatch.setattr(mirror_module, "engine_class", make)
    messages = iter(sent)
    monkeypatch.setattr(mirror_module, "broadcast", lambda tp, ops: next(messages))
    follower = SimpleNamespace(model=lm.model, config=lm.config, device=lm.device, decode=lm.decode)
    mirror_module.follow(follower, SimpleNamespace(rank=1, size=2))
    return made


def _submit(engine, prompt, seed, method="diffusiongemma-cai"):
    return engine.submit(prompt, build_settings(method, seed=seed, **KNOBS))


def test_cancel_cancel_all_and_drop_running_replay_on_the_follower(monkeypatch):
    lm = engine_lm(reference(seed=4, canvas_length=8))
    sent = _leader(monkeypatch, lm)
    engine = UniformEngine(lm, max_batch=2)
    a, b = _submit(engine, [5, 6, 7], 1), _submit(engine, [9, 10], 2, "greedy")
    _submit(engine, [11, 12, 13], 3)  # queued behind the two running
    engine.step()
    engine.cancel(a)  # running: the follower must drop it too
    engine.step()
    engine.step()
    engine.drop_running()
    engine.step()
    _submit(engine, [4, 4], 5)
    engine.cancel_all()
    _submit(engine, [7, 8], 6)
    while engine.has_work:
        engine.step()
    lm.mirror.stop()
    assert b not in engine.running and not engine.has_work
    (replayed,) = _replay(monkeypatch, lm, sent)  # a divergence would have raised RanksDiverged
    assert not replayed.has_work and replayed.steps == engine.steps
    ops = [op for message in sent for op, *_ in message]
    assert {"cancel", "cancel_all", "drop_running"} <= set(ops)


def test_a_cancel_the_follower_misses_is_caught_as_a_divergence(monkeypatch):
    """The safety net the test above relies on: without the cancel's message the follower's next step
    commits a request rank 0 no longer has."""
    lm = engine_lm(reference(seed=4, canvas_length=8))
    sent = _leader(monkeypatch, lm)
    engine = UniformEngine(lm, max_batch=2)
    a = _submit(engine, [5, 6, 7], 1)
    _submit(engine, [9, 10], 2)
    engine.step()
    engine.cancel(a)
    engine.step()
    lm.mirror.stop()
    missed = [[op for op in message if op[0] != "cancel"] for message in sent]
    with pytest.raises(mirror_module.RanksDiverged):
        _replay(monkeypatch, lm, missed)
