"""Issue 49: a light request without a cache keeps its pace beside long ones. Rows of canvases of
different sizes never share a forward (decode/scheduler.py: width_class), and a forward without a
cache computes no column left of its rows' first real one (models/modes/full.py), so a
short row in a frame widened by a long one pays its own width. Tokens never change."""

from types import SimpleNamespace

import pytest

from caidllm.decode import build_config
from caidllm.decode.engine import Engine
from caidllm.models.modes.full import Full

LIGHT = dict(method="vanilla", gen_length=16, block_length=16)
HEAVY = dict(method="vanilla", gen_length=128, block_length=16, early_stop=False)


@pytest.fixture(scope="module")
def tiny():
    import caidllm

    return caidllm.load("tiny", device="cpu", dtype="float32")


def test_rows_of_different_canvas_sizes_never_share_a_forward(tiny):
    engine = Engine(tiny, max_batch=4, step_policy="all")
    heavy = [engine.submit(tiny.encode_chat(f"{i} + {i} ="), build_config(**HEAVY)) for i in range(2)]
    light = engine.submit(tiny.encode_chat("not True is"), build_config(**LIGHT))
    groups = engine.scheduler.schedule()
    members = sorted(sorted(r.id for r in g.members) for g in groups)
    assert members == sorted([sorted(heavy), [light]])


def test_a_forward_without_a_cache_starts_at_its_first_real_column():
    full = Full()
    call = SimpleNamespace(cache=None, real_from=[6, 5], starts=[7, 6])
    assert full.computed_positions(call, None, 0)["lo"] == 5
    assert (
        full.computed_positions(SimpleNamespace(cache=None, real_from=None, starts=[7, 6]), None, 0)["lo"]
        == 0
    )
    assert (
        full.computed_positions(SimpleNamespace(cache=object(), real_from=[6, 5], starts=[7, 6]), None, 0)[
            "lo"
        ]
        == 0
    )
    # logits of the padding asked for (the whole canvas): every column
    assert (
        full.computed_positions(SimpleNamespace(cache=None, real_from=[6, 5], starts=[0, 0]), None, 0)["lo"]
        == 0
    )


def test_a_light_request_beside_long_ones_decodes_as_alone(tiny):
    prompt = tiny.encode_chat("not not ( True ) is")

    def light_tokens(with_heavy: bool, policy: str):
        engine = Engine(tiny, max_batch=4, step_policy=policy)
        for i in range(2 if with_heavy else 0):
            engine.submit(tiny.encode_chat(f"{i} + {i} * 2 ="), build_config(**HEAVY))
        rid = engine.submit(prompt, build_config(**LIGHT))
        return next(e.result.token_ids for e in engine.run() if e.finished and e.request_id == rid)

    want = light_tokens(False, "all")
    assert light_tokens(True, "all") == want and light_tokens(True, "fair") == want
