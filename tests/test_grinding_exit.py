"""grinding_action="exit" through the engine: after K low-yield steps the block ends in that same step,
with no mask left and fewer forwards than "continue"."""

import pytest

from caidllm.decode import build_config
from caidllm.decode.engine import Engine

PROMPT = [5, 6, 7, 8, 9, 10]


def run(lm, **cai):
    config = build_config("cai", gen_length=32, block_length=16, early_stop=False, gating=True, **cai)
    engine = Engine(lm, max_batch=1)
    engine.submit(PROMPT, config)
    events = list(engine.run())
    return events, events[-1].result


@pytest.mark.parametrize("patience", [3, 4])
def test_exit_ends_each_grinding_block_at_the_Kth_low_yield_step(llada_lm, patience):
    # A random model is unsure of everything: one commit per step (low-yield) from the start.
    _, grinding = run(llada_lm, grinding_patience=patience)
    assert grinding.steps_per_block[0] > patience  # "continue" grinds on past the K-th step
    events, result = run(llada_lm, grinding_patience=patience, grinding_action="exit")
    assert result.steps_per_block == [patience, patience]
    mask_id = llada_lm.config.mask_id
    assert mask_id not in result.token_ids and len(result.token_ids) == 32
    assert all(0 <= s < patience for s in result.trace.commit_step_in_block)
    last_of_block0 = [e for e in events if e.block == 0][-1]
    assert last_of_block0.step == patience - 1 and len(last_of_block0.positions) == 16 - (patience - 1)
    assert result.nfe == 2 * patience < grinding.nfe


def test_exit_changes_nothing_without_gating(llada_lm):
    config = dict(gen_length=32, block_length=16, early_stop=False, gating=False)
    a = llada_lm.generate([PROMPT], method="cai", **config)[0]
    b = llada_lm.generate([PROMPT], method="cai", grinding_action="exit", **config)[0]
    assert a.token_ids == b.token_ids and a.nfe == b.nfe
