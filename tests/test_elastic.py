"""Elastic-Cache (cache mode "elastic": decode/elastic.py, models/elastic.py): the engine's greedy output
equals a plain re-statement of the official loop (tests/elastic_reference.py: whole-generation window,
the stop at the first end token, the drift test and the tracked tokens as the official modeling file)
token for token and forward for forward, on random LLaDA weights (head scaled so thresholds fire, refreshes
from several depths and none) and on `tiny`; the block-wise reading (`elastic-block`) against the same
re-statement with its switch on; commits only inside the window, at every step; batch invariance;
refusals and bad settings."""

import pytest
import torch

import caidllm
from block_checkpoints import write_block_checkpoint
from caidllm.decode import build_config
from caidllm.decode.engine import Engine
from caidllm.errors import InputError
from caidllm.models.elastic import ElasticInputs
from caidllm.models.modes import Elastic
from elastic_reference import answer, official_elastic
from helpers.decoding import BLOCK, GEN, PROMPTS, block_of, run

PROMPTS = PROMPTS[:3]
TINY_PROMPTS = ["not ( True ) and ( True ) is", "True and not False or ( False ) is", "7 + 5 * 3 ="]


@pytest.fixture(scope="module")
def sharp_lm(random_checkpoint):
    """Random LLaDA weights, 4 layers, the head scaled so that confidences reach the thresholds."""
    lm = caidllm.load(random_checkpoint("llada", n_layers=4), device="cpu", dtype="float32")
    t = lm.model.model.transformer
    with torch.no_grad():
        (t.wte.weight if lm.config.tie_embeddings else t.ff_out.weight).mul_(40)
    return lm


@pytest.fixture(scope="module")
def tiny():
    return caidllm.load("tiny", device="cpu", dtype="float32")


def _compare(lm, prompt, method, window, gamma, threshold=0.9, gen=GEN, **options):
    ends = set(lm.config.eos_ids)
    scope = options.get("block_length", BLOCK) if method == "elastic-block" else None
    tokens, nfe, refreshes = official_elastic(
        lm,
        prompt,
        gen,
        window_length=window,
        gamma=gamma,
        threshold=threshold,
        end_tokens=ends,
        scope_block=scope,
    )
    result = run(
        lm,
        [prompt],
        method,
        gen_length=gen,
        elastic_window=window,
        elastic_gamma=gamma,
        threshold=threshold,
        early_stop=True,
        **options,
    )[0]
    assert answer(result.token_ids, ends) == answer(tokens, ends)
    assert result.nfe == nfe
    return refreshes


@pytest.mark.parametrize("method", ["elastic", "elastic-block"])
def test_engine_equals_the_official_loop_on_random_weights(sharp_lm, method):
    refreshes = []
    for prompt in PROMPTS:
        for threshold in (0.9, 0.5):
            for gamma in (0.3, 0.9, 0.99):
                refreshes += _compare(sharp_lm, prompt, method, 4, gamma, threshold)
    n = sharp_lm.config.n_layers
    assert any(0 < layer < n for layer in refreshes) and n in refreshes  # refreshes within the step, and none


def test_engine_equals_the_official_loop_on_tiny(tiny):
    refreshes = []
    for text in TINY_PROMPTS:
        for window, gamma in ((4, 0.9), (16, 0.9), (4, 0.99)):
            refreshes += _compare(tiny, tiny.encode_chat(text), "elastic", window, gamma, gen=64)
    n = tiny.config.n_layers
    assert any(0 < layer < n for layer in refreshes) and n in refreshes


def test_the_block_wise_reading_differs_from_the_official(tiny):
    prompts = [tiny.encode_chat(text) for text in TINY_PROMPTS]
    official = run(tiny, prompts, "elastic", gen_length=64, early_stop=True)
    blockwise = run(tiny, prompts, "elastic-block", gen_length=64, block_length=16, early_stop=True)
    assert any(a.token_ids != b.token_ids or a.nfe != b.nfe for a, b in zip(official, blockwise))


@pytest.mark.parametrize("method", ["elastic", "elastic-block", "cai-elastic"])
def test_commits_stay_inside_the_window_at_every_step(sharp_lm, method):
    engine = Engine(sharp_lm, max_batch=1)
    config = build_config(
        method,
        gen_length=GEN,
        block_length=block_of(method),
        early_stop=False,
        elastic_window=2,
        threshold=0.05,
    )
    engine.submit(PROMPTS[0], config)
    generated = [None] * GEN
    while True:
        for event in engine.step():
            masked = [p for p in range(GEN) if generated[p] is None]
            scope = masked if method == "elastic" else [p for p in masked if p // BLOCK == event.block]
            assert set(event.positions) <= set(scope[:2]) or len(scope) == len(event.positions)
            for p, token in zip(event.positions, event.token_ids):
                generated[p] = token
            if event.finished:
                return


def test_the_first_forward_computes_every_column_and_tracks_no_mask(sharp_lm):
    lm = sharp_lm
    mask = lm.config.mask_id
    ids = torch.tensor([[5, 6, 7] + [mask] * 8])
    cache = lm.new_cache(1, ids.shape[1], every_layer=True)
    n = lm.config.n_layers
    first = ElasticInputs(
        torch.arange(11)[None],
        torch.tensor([[3, 4]]),
        n,
        profiled=torch.tensor([[3, 4]]),
        untrackable=[list(range(3, 11))],
        whole=True,
    )
    logits = lm.forward(ids, cache=cache, mode=Elastic(inputs=first))
    assert torch.allclose(logits, lm.forward(ids)[:, [3, 4]], rtol=1e-4, atol=1e-4)
    assert first.refresh_from == n and first.tracked[0] and all(c < 3 for c in first.tracked[0])
    changed = ids.clone()
    changed[0, 8] = 9  # a column it does not compute: stale without a refresh, fresh with one from layer 0
    stale = ElasticInputs(torch.tensor([[3, 4]]), torch.tensor([[3, 4]]), n, gamma=1e-9)
    assert torch.allclose(
        lm.forward(changed, cache=cache, mode=Elastic(inputs=stale)), logits, rtol=1e-4, atol=1e-4
    )
    fresh = ElasticInputs(torch.tensor([[3, 4, 8]]), torch.tensor([[3, 4]]), 0)
    assert torch.allclose(
        lm.forward(changed, cache=cache, mode=Elastic(inputs=fresh)),
        lm.forward(changed)[:, [3, 4]],
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("method", ["elastic", "elastic-block", "cai-elastic"])
def test_batch_invariance(lm, method):
    options = dict(elastic_gamma=0.99, elastic_window=4)
    alone = [run(lm, [prompt], method, **options)[0] for prompt in PROMPTS]
    together = run(lm, PROMPTS, method, batch_size=3, **options)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.trace.commit_step == b.trace.commit_step
    # Joining mid-flight: the second request is submitted after the first has taken two steps.
    engine = Engine(lm, max_batch=4)
    config = build_config(method, gen_length=GEN, block_length=block_of(method), early_stop=False, **options)
    first = engine.submit(PROMPTS[0], config)
    engine.step()
    engine.step()
    second = engine.submit(PROMPTS[1], config)
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert results[first].token_ids == alone[0].token_ids
    assert results[second].token_ids == alone[1].token_ids


def test_dream_runs_every_reading(dream_lm):
    for method in ("elastic", "elastic-block", "cai-elastic"):
        results = run(dream_lm, PROMPTS, method, elastic_gamma=0.99, elastic_window=4)
        assert all(len(r.token_ids) == GEN and dream_lm.config.mask_id not in r.token_ids for r in results)


def test_cai_elastic_runs_with_fewer_computed_pairs(sharp_lm):
    cai = run(sharp_lm, PROMPTS, "cai-elastic", elastic_gamma=0.3, elastic_window=4)
    assert all(len(r.token_ids) == GEN and sharp_lm.config.mask_id not in r.token_ids for r in cai)
    assert all(r.computed_fraction < 1 for r in cai)  # the window, not the whole block, at most steps


@pytest.mark.parametrize(
    "method, options, error",
    [
        ("elastic", dict(elastic_gamma=0), "elastic_gamma must be in \\(0, 1\\]"),
        ("elastic", dict(elastic_gamma=1.5), "elastic_gamma must be in \\(0, 1\\]"),
        ("elastic", dict(elastic_window=0), "elastic_window must be a positive integer"),
        (
            "elastic",
            dict(elastic_window=GEN + 1),
            f"elastic_window \\({GEN + 1}\\) is longer than the generation \\(gen_length {GEN}\\)",
        ),
        (
            "elastic-block",
            dict(elastic_window=BLOCK + 1),
            f"elastic_window \\({BLOCK + 1}\\) is longer than the block \\({BLOCK}\\)",
        ),
        (
            "elastic",
            dict(elastic_scope="blocks"),
            "elastic_scope must be one of generation, block, got 'blocks'",
        ),
        ("elastic", dict(elastic_track=0), "elastic_track must be a positive integer"),
        ("elastic", dict(elastic_layer=-1), "elastic_layer must be an integer >= 0"),
        ("elastic", dict(elastic_layer=2), "elastic_layer \\(2\\) is beyond the model's layers .*has 2"),
        ("elastic", dict(refresh_every=4), "cache 'elastic' with refresh_every=4 is not meaningful"),
    ],
)
def test_bad_settings_name_the_field(llada_lm, method, options, error):
    with pytest.raises(InputError, match=error):
        run(llada_lm, PROMPTS[:1], method, **options)


def test_cai_exit_over_elastic_is_refused(llada_lm):
    with pytest.raises(InputError, match="cache 'elastic' with cai.grinding_action='exit' is not meaningful"):
        run(llada_lm, PROMPTS[:1], "cai-elastic", cai=dict(grinding_action="exit"))


@pytest.mark.parametrize("method", ["elastic", "cai-elastic"])
def test_block_causal_family_is_refused_naming_both(tmp_path, method):
    lm = caidllm.load(write_block_checkpoint(tmp_path / "sdar", "sdar"), device="cpu", dtype="float32")
    with pytest.raises(InputError, match="cache mode 'elastic' needs .*family 'sdar'.*block-causal"):
        run(lm, PROMPTS[:1], method)
