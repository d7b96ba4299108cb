"""The step-level engine: requests joining and leaving a running batch, the
commit stream, cancellation, limits and bad input (random LLaDA / Dream and
the tiny model, fp32 CPU)."""

import asyncio
import threading
import time

import pytest

import caidllm
from caidllm.decode import build_config
from caidllm.decode.background import BackgroundEngine, RequestCancelled
from caidllm.decode.engine import Engine
from caidllm.errors import EngineFullError, InputError

GEN, BLOCK = 16, 8
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [23, 24, 25, 26]]
METHODS = ["cai", "vanilla", "fastdllm-prefix", "es-dllm", "cai-gate-on", "fastdllm"]


@pytest.fixture(params=["llada", "dream"])
def lm(request, llada_lm, dream_lm):
    return llada_lm if request.param == "llada" else dream_lm


def config(method, **kw):
    kw = {"gen_length": GEN, "block_length": BLOCK, "early_stop": False, "threshold": 0.2, **kw}
    return build_config(method, **kw)


def alone(lm, prompt, method, **kw):
    engine = Engine(lm, max_batch=1)
    engine.submit(prompt, config(method, **kw))
    (result,) = [e.result for e in engine.run() if e.finished]
    return result


def same(a, b, exact_confidence=True):
    """Same tokens, NFE, steps and commit steps (and, on the small random models, where no BLAS
    kernel changes with the row count, the same first-step confidences to the last bit)."""
    keys = (a.token_ids, a.nfe, a.steps_per_block, a.trace.commit_step, a.early_stopped) == (
        b.token_ids,
        b.nfe,
        b.steps_per_block,
        b.trace.commit_step,
        b.early_stopped,
    )
    return keys and (not exact_confidence or a.trace.first_confidence == b.trace.first_confidence)


def test_mid_flight_joins_match_alone_and_static_batches(lm):
    """Requests of other prompt lengths, methods and block lengths join while others run."""
    plan = [  # (step at which it is submitted, prompt, method, extra settings)
        (0, PROMPTS[0], "cai", {}),
        (0, PROMPTS[1], "vanilla", {}),
        (2, PROMPTS[2], "fastdllm-prefix", {}),
        (3, PROMPTS[3], "es-dllm", {}),
        (3, PROMPTS[1], "fastdllm", dict(gen_length=32, block_length=16)),
        (5, PROMPTS[0], "cai-gate-on", dict(temperature=0.7, seed=3)),
        (6, PROMPTS[2], "vanilla", dict(steps=8)),  # T = 4 beside T = 8 rows of the same policy
        (6, PROMPTS[3], "fastdllm-prefix", dict(gen_length=32)),  # prefix rows at other blocks and starts
        (7, PROMPTS[1], "es-dllm", dict(es_schedule=((1.0, 0.0), (0.5, 0.5)))),  # another skip schedule
        (9, PROMPTS[0], "fastdllm-prefix", {}),
    ]
    engine = Engine(lm, max_batch=5)
    results, ids, step = {}, [], 0
    while len(ids) < len(plan) or engine.has_work:
        for when, prompt, method, kw in plan:
            if when == step:
                ids.append(engine.submit(prompt, config(method, **kw)))
        results.update({e.request_id: e.result for e in engine.step() if e.finished})
        step += 1
    # all freed, frame narrowed
    assert engine.scheduler.frame.free_slots() == [0, 1, 2, 3, 4] and engine.scheduler.frame.width == 1
    for rid, (_, prompt, method, kw) in zip(ids, plan):
        assert same(results[rid], alone(lm, prompt, method, **kw)), method
    # The same requests as one static batch through generate().
    for method in ("cai", "fastdllm-prefix", "es-dllm"):
        batch = lm.generate(
            PROMPTS,
            method=method,
            gen_length=GEN,
            block_length=BLOCK,
            early_stop=False,
            threshold=0.2,
            batch_size=4,
        )
        for prompt, joint in zip(PROMPTS, batch):
            assert same(joint, alone(lm, prompt, method))


def test_tiny_model_mid_flight_matches_alone():
    """The shipped model, where padding used to move confidences in the last bits."""
    lm = caidllm.load("tiny", device="cpu", dtype="float32")
    prompts = [
        lm.encode_chat(p)
        for p in ("7 + 5 * 3 =", "True and not False or ( False ) is", "not ( True ) and ( True ) is")
    ]
    settings = dict(gen_length=32, block_length=8, early_stop=True)
    engine = Engine(lm, max_batch=3)
    first = engine.submit(prompts[0], build_config("cai", **settings))
    engine.step()
    second = engine.submit(prompts[1], build_config("vanilla", **settings))
    engine.step()
    third = engine.submit(prompts[2], build_config("fastdllm", **settings))
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    for rid, prompt, method in (
        (first, prompts[0], "cai"),
        (second, prompts[1], "vanilla"),
        (third, prompts[2], "fastdllm"),
    ):
        (single,) = lm.generate([prompt], method=method, **settings)
        assert same(results[rid], single, exact_confidence=False)
        # Same keys and columns as alone; only MKL's choice of GEMM kernel by row count can move the
        # last bits (README, "The step-level engine").
        assert results[rid].trace.first_confidence == pytest.approx(single.trace.first_confidence, abs=1e-4)


def test_requests_in_the_same_phase_share_one_forward(llada_lm):
    engine = Engine(llada_lm, max_batch=4, step_policy="all")  # every group at every step
    for prompt in PROMPTS[:3]:  # three prompt lengths, one method: every step is one forward
        engine.submit(prompt, config("fastdllm", threshold=1.0))
    engine.step()
    assert engine.runner.forwards == 1  # the three refreshes of block 0 in one full forward
    engine.step()
    assert engine.runner.forwards == 2  # then one dual forward for the three rows
    engine.submit(PROMPTS[3], config("fastdllm", threshold=1.0))
    engine.step()
    assert engine.runner.forwards == 4  # the newcomer's refresh is a full forward beside the others' dual one


def test_commit_stream(lm):
    engine = Engine(lm, max_batch=2)
    rid = engine.submit(PROMPTS[0], config("cai"))
    other = engine.submit(PROMPTS[2], config("vanilla"))
    events = [e for e in engine.run() if e.request_id == rid]
    result = events[-1].result
    assert events[-1].finished and not any(e.finished for e in events[:-1])
    assert same(result, alone(lm, PROMPTS[0], "cai"))
    assert len(events) == result.nfe
    seen = []
    for e in events:
        for p, token, s in zip(e.positions, e.token_ids, e.first_confidence):
            assert result.token_ids[p] == token
            assert result.trace.commit_step_in_block[p] == e.step and p // BLOCK == e.block
            assert result.trace.first_confidence[p] == s
            seen.append(p)
    assert sorted(seen) == list(range(GEN))  # every position committed exactly once
    assert other not in {e.request_id for e in events}


def test_early_stop_leaves_at_once(llada_lm):
    from test_engine import EndsEarly

    lm = EndsEarly(llada_lm, 0, after=0)  # EOS wins everywhere: the answer is empty
    engine = Engine(lm, max_batch=2)
    rid = engine.submit(PROMPTS[0], config("fastdllm", gen_length=32, early_stop=True))
    (event,) = engine.step()
    assert event.finished and event.result.early_stopped and event.result.nfe == 1
    assert not engine.has_work and engine.scheduler.frame.free_slots() == [0, 1]
    with pytest.raises(InputError, match="already finished"):
        engine.cancel(rid)


def test_cancel_frees_the_slot_and_spares_the_others(lm):
    engine = Engine(lm, max_batch=2)
    keep = engine.submit(PROMPTS[0], config("cai"))
    drop = engine.submit(PROMPTS[2], config("fastdllm"))
    queued = engine.submit(PROMPTS[3], config("vanilla"))
    engine.step()
    engine.cancel(queued)  # still waiting: leaves the queue
    engine.cancel(drop)  # in flight: leaves now
    assert sorted(engine.scheduler.running) == [keep] and len(engine.scheduler.frame.free_slots()) == 1
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert list(results) == [keep] and same(results[keep], alone(lm, PROMPTS[0], "cai"))
    with pytest.raises(InputError, match="cannot cancel request 'nope': unknown"):
        engine.cancel("nope")
    with pytest.raises(InputError, match="already finished"):
        engine.cancel(drop)


def test_limits(llada_lm):
    engine = Engine(llada_lm, max_batch=2, max_queue=1)
    for prompt in PROMPTS[:3]:
        engine.submit(prompt, config("fastdllm"))
    with pytest.raises(EngineFullError, match="max_batch 2, max_queue 1"):
        engine.submit(PROMPTS[3], config("fastdllm"))
    engine.step()
    assert len(engine.scheduler.running) == 2 and len(engine.scheduler.queue) == 1  # past max_batch: queued
    with pytest.raises(InputError, match="max_batch must be an integer >= 1"):
        Engine(llada_lm, max_batch=0)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([1, 2, 100000], "token id 100000 is outside the vocabulary"),
        ([], "non-empty list of token ids"),
        ([1, True], "non-empty list of token ids"),
        ("hello", "non-empty list of token ids"),
        ("too long", "exceeds the model's context"),
    ],
)
def test_bad_requests_are_refused_alone(llada_lm, prompt, message):
    if prompt == "too long":
        prompt = [5] * llada_lm.config.max_length
    engine = Engine(llada_lm, max_batch=2)
    good = engine.submit(PROMPTS[1], config("cai"))
    engine.step()
    with pytest.raises(InputError, match=message):
        engine.submit(prompt, config("cai"))
    assert len(engine.scheduler.queue) == 0 and list(engine.scheduler.running) == [good]
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert same(results[good], alone(llada_lm, PROMPTS[1], "cai"))


def test_a_config_changed_after_submit_does_not_reach_the_request(llada_lm):
    engine = Engine(llada_lm)
    c = config("cai")
    engine.submit(PROMPTS[0], c)
    c.gen_length = 32  # the caller reuses its config
    (result,) = [e.result for e in engine.run() if e.finished]
    assert same(result, alone(llada_lm, PROMPTS[0], "cai"))


def test_invalid_config_is_refused_before_queueing(llada_lm):
    engine = Engine(llada_lm)
    bad = config("cai")
    bad.policy_settings.threshold = 1.5
    with pytest.raises(InputError, match=r"threshold must be in \(0, 1\]"):
        engine.submit(PROMPTS[0], bad)
    with pytest.raises(InputError, match="config must be a DecodeConfig"):
        engine.submit(PROMPTS[0], {"method": "cai"})
    assert not engine.has_work


def test_background_engine_threads_and_asyncio(llada_lm):
    background = BackgroundEngine(Engine(llada_lm, max_batch=2, max_queue=8)).start()
    try:
        expected = {i: alone(llada_lm, p, m) for i, (p, m) in enumerate(zip(PROMPTS, METHODS))}
        got = {}

        def client(i):
            got[i] = background.submit(PROMPTS[i], config(METHODS[i])).wait()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert all(same(got[i], expected[i]) for i in range(4))

        async def stream_one():
            handle = background.submit(PROMPTS[2], config("cai"), loop=asyncio.get_running_loop())
            events = [e async for e in handle.stream()]
            return events[-1].result

        assert same(asyncio.run(stream_one()), alone(llada_lm, PROMPTS[2], "cai"))

        handle = background.submit(PROMPTS[0], config("vanilla", gen_length=64))
        next(iter(handle))  # its first step ran
        background.cancel(handle.id)
        with pytest.raises(RequestCancelled):
            handle.wait()
        with pytest.raises(InputError, match="unknown or already finished"):
            background.cancel(handle.id)
        assert background.pending == 0
    finally:
        background.stop(timeout=30)


def test_background_failing_step_spares_the_queue_and_stop_cancels(llada_lm):
    engine = Engine(llada_lm, max_batch=1, max_queue=4)
    background = BackgroundEngine(engine).start()
    try:
        bad = background.submit(PROMPTS[0], config("cai"), request_id="bad")
        good = background.submit(PROMPTS[1], config("cai"), request_id="queued-good")

        def explode(view):
            raise RuntimeError("policy exploded")

        deadline = time.monotonic() + 10
        while "bad" not in engine.scheduler.running and time.monotonic() < deadline:
            time.sleep(0.001)
        engine.scheduler.running["bad"].policy = explode  # the next step of the in-flight row fails
        with pytest.raises(RuntimeError, match="policy exploded"):
            bad.wait()
        assert same(good.wait(), alone(llada_lm, PROMPTS[1], "cai"))  # the queued request still runs
        assert good.wait() is good.result  # waiting again returns at once
        slow = background.submit(PROMPTS[2], config("vanilla", gen_length=256))
    finally:
        background.stop(timeout=30)
    with pytest.raises(RequestCancelled):
        slow.wait()
    with pytest.raises(EngineFullError, match="not running"):
        background.submit(PROMPTS[0], config("cai"))


def test_background_async_cancel(llada_lm):
    background = BackgroundEngine(Engine(llada_lm, max_batch=2)).start()
    try:

        async def cancel_mid_stream():
            handle = background.submit(
                PROMPTS[0], config("vanilla", gen_length=128), loop=asyncio.get_running_loop()
            )
            with pytest.raises(InputError, match="use `async for"):
                iter(handle).__next__()
            seen = 0
            with pytest.raises(RequestCancelled):
                async for _ in handle.stream():
                    seen += 1
                    if seen == 2:
                        background.cancel(handle.id)
            return seen

        assert asyncio.run(cancel_mid_stream()) >= 2
        assert background.pending == 0 and not background.engine.scheduler.running
    finally:
        background.stop(timeout=30)


def test_rows_of_one_policy_with_other_step_counts(lm):
    """Same policy, same step and block, different T: each keeps its own schedule."""
    engine = Engine(lm, max_batch=2)
    a = engine.submit(PROMPTS[0], config("vanilla"))
    b = engine.submit(PROMPTS[1], config("vanilla", steps=4))
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert results[b].steps_per_block == [2, 2]
    assert same(results[a], alone(lm, PROMPTS[0], "vanilla"))
    assert same(results[b], alone(lm, PROMPTS[1], "vanilla", steps=4))
