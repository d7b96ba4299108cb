"""LLaDA2.2's InDel decoder (decode/policies/indel.py, method "llada2.2"): SGLang's own unit scenarios of
JointThresholdInDel, token parity with a re-statement of it driving the same model without a cache
(indel_reference.py), the exact block cache and batch invariance while blocks shift, streaming only
final blocks, and the refusals."""

import httpx
import pytest
import torch

import caidllm
import indel_reference as ref
from caidllm.decode import build_config
from caidllm.decode.engine import Engine
from caidllm.decode.policies.indel import BlockState, IndelSettings, Tokens, apply_edits, indel_step
from caidllm.errors import InputError, ModelLoadError
from caidllm.models.block_configs import _edit_tokens
from caidllm.models.config import ConfigFields
from helpers.serve import start

MASK, DELETE, SPLIT, VOCAB = 0, 1, 2, 12
IDS = Tokens(MASK, DELETE, SPLIT)
SMALL = (
    "random:llada2.2-flash?num_hidden_layers=2&hidden_size=32&num_attention_heads=4&num_key_value_heads=2"
    "&head_dim=8&rotary_dim=4&intermediate_size=48&moe_intermediate_size=8&num_experts=16"
    "&num_experts_per_tok=2&expert_capacity=4&block_size=8&max_position_embeddings=256"
)


def logits_of(rows):
    """Logits from rows of token ids, most likely first (SGLang's test helper)."""
    logits = torch.full((len(rows), VOCAB), -20.0)
    for i, candidates in enumerate(rows):
        for rank, token in enumerate(candidates):
            logits[i, token] = 10.0 - rank
    return logits


def state_of(tokens, **changes):
    prompt_len = 0
    while prompt_len < len(tokens) and tokens[prompt_len] != MASK:
        prompt_len += 1
    state = BlockState(prompt_len, [i >= prompt_len and t == MASK for i, t in enumerate(tokens)])
    for name, value in changes.items():
        setattr(state, name, value)
    return state


def run(tokens, logits, state=None, **settings):
    state = state or state_of(tokens)
    return indel_step(state, IndelSettings(**settings), logits, tokens, IDS) + (state,)


# ---- SGLang's unit scenarios (test_joint_threshold_indel.py), their expected blocks ----------------------


def test_edit_operations():
    assert apply_edits(
        [1, 2, 3, 1, 2, 6, 0, 0], [1, 2, 3, 4, 5, 6, 0, 0], [0, 0, 1, 0, 1, 0, 0, 0], 2, IDS
    ) == (
        [1, 2, 3, 0, 5, 6, 0, 0],
        [0, 0, 1, False, 1, 0, 0, 0],
    )
    assert apply_edits([1, 2, 1, 1, 1, 1], [1, 2, 3, 4, 5, 6], [False] * 6, 2, IDS)[0] == [1, 2, 0, 0, 0, 0]
    tokens, flags = apply_edits([1, 2, 2, 2, 2, 2], [1, 2, 3, 4, 5, 6], [0, 0, 1, 0, 1, 0], 2, IDS)
    assert tokens == [1, 2, 0, 3, 0, 4] and [bool(f) for f in flags] == [0, 0, 0, 1, 0, 0]


def test_split_and_delete_move_the_original_masks():
    tokens, ended, state = run([3, 0, 0, 0, 0], logits_of([[3], [SPLIT, 5], [DELETE, 6], [7], [8]]))
    assert tokens == [3, 0, 0, 7, 8] and not ended and state.original == [False, False, True, True, True]


@pytest.mark.parametrize(
    "tokens, rows, threshold, expected",
    [
        ([3, 0, 4], [[3], [MASK, 5], [4]], 1.1, [3, 5, 4]),  # an original mask never takes the mask
        ([3, 0, 4, 4], [[3], [SPLIT, 5], [4], [4]], 1.1, [3, 0, 0, 4]),  # SPLIT keeps one original mask
    ],
)
def test_selection(tokens, rows, threshold, expected):
    assert run(tokens, logits_of(rows), threshold=threshold)[0] == expected


def test_fallback_confidence_and_quota():
    logits = torch.zeros(4, VOCAB)
    logits[0, 3], logits[1, MASK], logits[2, 6], logits[3, 4] = 10, 10, 4, 10
    assert run([3, 0, 0, 4], logits, threshold=0.6)[0] == [3, 0, 6, 4]
    logits = torch.zeros(5, VOCAB)
    logits[0, 3] = 10
    for position, score in zip([3, 4, 1, 2], [9, 8, 7, 6]):
        logits[position, position + 4] = score
    state = state_of([3, 0, 0, 0, 0], original=[False, True, True, False, False])
    assert run([3, 0, 0, 0, 0], logits, state, threshold=1.1)[0] == [3, 5, 0, 7, 8]


def test_t2t_and_post_edit_steps():
    state = state_of([3, 0, 0, 0], original=[False] * 4)
    tokens, ended, _ = run(
        [3, 0, 0, 0], logits_of([[3], [MASK, 5], [MASK, 6], [MASK, 7]]), state, max_post_edit_steps=2
    )
    assert tokens == [3, 0, 0, 0] and not ended and state.post_edit_steps == 1
    assert run([3, 0, 4, 0], logits_of([[5], [7], [6], [8]]), edit_threshold=0.9)[0] == [3, 7, 6, 8]


def test_final_cleanup_and_stable_end():
    state = state_of([3, 0, 0, 4], original=[False] * 4)
    rows = [[DELETE, 8], [MASK, 5], [DELETE, 6], [SPLIT, 7]]
    tokens, ended, _ = run([3, 0, 0, 4], logits_of(rows), state, max_post_edit_steps=1)
    assert tokens == [3, 5, 6, 7] and ended
    assert run([3, 4, 5], logits_of([[3], [4], [5]]))[:2] == ([3, 4, 5], True)


def test_anti_loop_never_rewrites_a_token_written_before():
    state = state_of([3, 0, 4])
    state.seen.add((3, MASK, 4))
    state.written[1] = {5}
    tokens, _, _ = run([3, 0, 4], logits_of([[3], [5, MASK, 6], [4]]), state, threshold=1.1)
    assert tokens == [3, 6, 4] and state.written[1] == {5, 6}


# ---- the decoder on a model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm():
    model = caidllm.load(SMALL, device="cpu", dtype="float32")
    with torch.no_grad():  # edit tokens likely enough that blocks shift
        model.model.lm_head.weight[list(model.config.edit_tokens)] *= 30
    return model


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]


@pytest.fixture(scope="module")
def alone(lm):
    """Each prompt decoded alone with llada2.2 (blocks of 8, 16 tokens, no early stop)."""
    return [lm.generate([p], gen_length=16, method="llada2.2", early_stop=False)[0] for p in PROMPTS]


def test_token_parity_with_the_re_stated_decoder(lm, alone):
    for prompt, ours in zip(PROMPTS, alone):
        tokens, forwards = ref.generate(lm, prompt, 16, 8)
        assert ours.token_ids == tokens
        # SGLang forwards once more after a final cleanup that changed the block; the fold writes it here
        assert all(f - 1 <= s <= f for s, f in zip(ours.steps_per_block, forwards))
        assert max(forwards) > 9  # edits happened: more steps than a block of 8 needs without them


def test_cache_exact_and_batch_invariant_while_blocks_shift(lm, alone):
    batched = lm.generate(PROMPTS, gen_length=16, method="llada2.2", early_stop=False)
    uncached = lm.generate(PROMPTS, gen_length=16, method="llada2.2", early_stop=False, cache="none")
    for b, u, a in zip(batched, uncached, alone):
        assert b.token_ids == u.token_ids == a.token_ids


def test_a_stream_shows_final_blocks_only(lm):
    engine = Engine(lm, max_batch=1)
    engine.submit(PROMPTS[0], build_config("llada2.2", gen_length=16, block_length=8, early_stop=False))
    shown, events = {}, []
    while not events or not events[-1].finished:
        events += engine.step()
    for event in events:
        shown.update(zip(event.positions, event.token_ids))
    final = events[-1].result.token_ids
    assert shown == dict(enumerate(final))
    reported = [e for e in events if e.positions]
    assert [sorted(e.positions) for e in reported] == [[0], list(range(1, 9)), list(range(9, 16))]


def test_indel_on_a_model_without_edit_tokens_is_refused():
    spec = SMALL.replace("llada2.2-flash", "llada2-mini").replace("&expert_capacity=4&block_size=8", "")
    plain = caidllm.load(spec, device="cpu", dtype="float32")
    with pytest.raises(InputError, match="delete_token_id") as e:
        plain.generate([[5, 6, 7]], gen_length=32, method="llada2.2")
    assert e.value.field == "method" and "\n" not in str(e.value)
    with pytest.raises(InputError, match="no edit tokens") as e:  # an InDel setting under another method
        plain.generate([[5, 6, 7]], gen_length=32, method="llada2", indel={"edit_threshold": 0.3})
    assert e.value.field == "indel"
    with start(plain) as server:  # the server answers 400 naming the field
        body = {"prompt": "hello", "method": "llada2.2", "gen_length": 32, "block_length": 32}
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "method"
    assert "delete_token_id" in r.json()["error"]["message"]


def test_a_half_declared_edit_token_is_refused():
    raw = {"delete_token_id": 9, "vocab_size": 100}
    with pytest.raises(ModelLoadError, match="split_token_id is missing"):
        _edit_tokens(raw, ConfigFields(raw, "x"), "x", {"vocab_size": 100, "mask_id": 5})
    raw["split_token_id"] = 5
    with pytest.raises(ModelLoadError, match="distinct"):
        _edit_tokens(raw, ConfigFields(raw, "x"), "x", {"vocab_size": 100, "mask_id": 5})


def test_logprobs_constraints_and_sampling_are_refused_with_indel(lm):
    with pytest.raises(InputError, match="greedily") as e:
        lm.generate([[5, 6, 7]], gen_length=16, method="llada2.2", block_length=8, temperature=0.7)
    assert e.value.field == "temperature"
    with pytest.raises(InputError, match="revises"):
        lm.generate([[5, 6, 7]], gen_length=16, method="llada2.2", block_length=8, logprobs=2)
    with pytest.raises(InputError, match="revises"):
        lm.generate([[5, 6, 7]], gen_length=16, method="llada2.2", block_length=8, regex="[ab]+")


def test_beside_another_decoder_in_one_batch(lm, alone):
    engine = Engine(lm, max_batch=2)
    methods = ("llada2.2", "llada2.1-speed")
    for prompt, method in zip(PROMPTS, methods):
        engine.submit(prompt, build_config(method, gen_length=16, block_length=8, early_stop=False))
    results = []
    while len(results) < 2:
        results += [e.result for e in engine.step() if e.finished]
    by_method = {r.method: r.token_ids for r in results}
    assert by_method["llada2.2"] == alone[0].token_ids
    speed = lm.generate([PROMPTS[1]], gen_length=16, method="llada2.1-speed", early_stop=False)[0]
    assert by_method["llada2.1-speed"] == speed.token_ids
