"""Elastic-Cache (cache mode "elastic": decode/elastic.py, models/elastic.py) and CAI over it
("cai-elastic"): the engine's greedy output equals a plain re-statement of the paper's loop (no engine,
no batching) token for token on random LLaDA and Dream weights, at settings where the drift test
refreshes (from different depths) and the result differs from no cache; the forward itself; batch
invariance (alone, static batch, joining mid-flight); refusals and bad settings."""

import pytest
import torch

from block_checkpoints import write_block_checkpoint

import caidllm
from caidllm.decode import build_config
from caidllm.decode.engine import Engine
from caidllm.decode.sampling import predict
from caidllm.errors import InputError
from caidllm.models.elastic import ElasticInputs
from helpers.decoding import BLOCK, GEN, PROMPTS, run

PROMPTS = PROMPTS[:3]
GAMMA, WINDOW = 0.99, 4  # random weights attend almost evenly: a tight gamma makes the drift test fire


@pytest.fixture(scope="module", params=["llada", "dream"])
def deep_lm(request, random_checkpoint):
    return caidllm.load(random_checkpoint(request.param, n_layers=4), device="cpu", dtype="float32")


def commit(x, logits, allowed, mask, threshold, everything):
    """Fast-dLLM's threshold rule over the allowed columns: those at or above it, and always the best."""
    tokens, confidence = predict(logits[None].clone(), mask, 0.0, None)
    conf = confidence[0]
    chosen = list(range(len(allowed))) if everything else [i for i in range(len(allowed)) if conf[i] >= threshold]
    best = max(range(len(allowed)), key=lambda i: (conf[i], -i))
    for i in set(chosen) | {best}:
        x[0, allowed[i]] = tokens[0, i]
    return {allowed[i] for i in set(chosen) | {best}}


def elastic_reference(lm, prompt, gamma, window, boundary=0, threshold=0.9, gen=GEN, block=BLOCK):
    """The paper's loop at batch size 1: a full forward at each block's start; then per step the window
    (the block's first `window` masked positions, all of them at the block's last step), what predicts
    it and the previous step's most-attended tokens are computed, the rest read from the cache, from the
    layer the previous step's drift test named on over every column. Returns the tokens and the
    refresh layers the test chose."""
    mask = lm.config.mask_id
    p, n_layers, shift = len(prompt), lm.config.n_layers, lm.model.extra_left
    x = torch.tensor([prompt + [mask] * gen])
    cache = lm.new_cache(1, x.shape[1], every_layer=True)
    steps = gen // (gen // block)
    chosen_layers = []
    for b in range(gen // block):
        lo, hi = p + b * block, p + (b + 1) * block
        logits = lm.forward(x, mode="full", cache=cache)[0, lo:hi]
        masked = [c for c in range(lo, hi) if x[0, c] == mask]
        decoded = commit(x, logits[[c - lo for c in masked]], masked, mask, threshold, False)
        previous, watched, refresh_from = None, [], n_layers
        for i in range(1, steps):
            masked = [c for c in range(lo, hi) if x[0, c] == mask]
            if not masked:
                break
            win = masked if i == steps - 1 else masked[:window]
            columns = sorted(set(win) | {c - shift for c in win} | set(watched) | decoded)
            inputs = ElasticInputs(torch.tensor([columns]), torch.tensor([win]), refresh_from)
            logits = lm.forward_elastic(x, cache, inputs, real_from=[0])[0]
            decoded = commit(x, logits, win, mask, threshold, i == steps - 1)
            profiles = inputs.profiles[0]
            refresh_from = n_layers
            if previous is not None:
                for layer in range(boundary, n_layers):
                    before = previous[layer][:, watched].flatten()
                    now = profiles[layer][:, watched].flatten()
                    if float(torch.nn.functional.cosine_similarity(before, now, dim=0)) < gamma:
                        refresh_from = layer
                        break
                chosen_layers.append(refresh_from)
            previous = profiles
            watched = sorted({int(profile.mean(dim=0).argmax()) for profile in profiles})
    return x[0, p:].tolist(), chosen_layers


@pytest.mark.parametrize("boundary", [0, 2])
def test_elastic_matches_the_paper_loop(deep_lm, boundary):
    options = dict(elastic_gamma=GAMMA, elastic_window=WINDOW, elastic_layer=boundary)
    results = run(deep_lm, PROMPTS, "elastic", **options)
    layers = []
    for prompt, r in zip(PROMPTS, results):
        tokens, chosen = elastic_reference(deep_lm, prompt, GAMMA, WINDOW, boundary)
        assert r.token_ids == tokens
        layers += chosen
    n = deep_lm.config.n_layers
    assert any(layer < n for layer in layers) and any(layer == n for layer in layers)  # it refreshes, not always
    assert min(layers) >= boundary
    plain = run(deep_lm, PROMPTS, "elastic", cache="none", **options)
    assert any(a.token_ids != b.token_ids for a, b in zip(results, plain))  # the cache is really used


def test_elastic_forward_without_a_refresh_reads_the_cache(llada_lm):
    mask = llada_lm.config.mask_id
    ids = torch.tensor([[5, 6, 7] + [mask] * 8])
    cache = llada_lm.new_cache(1, ids.shape[1], every_layer=True)
    full = llada_lm.forward(ids, mode="full", cache=cache)
    n = llada_lm.config.n_layers
    for refresh_from in (n, 1, 0):  # right after a refresh, any depth of refresh gives the full forward's logits
        inputs = ElasticInputs(torch.tensor([[2, 3, 4, 9]]), torch.tensor([[3, 4]]), refresh_from)
        assert torch.allclose(llada_lm.forward_elastic(ids, cache, inputs, real_from=[0]), full[:, [3, 4]], atol=1e-5)
        assert len(inputs.profiles[0]) == n and inputs.profiles[0][0].shape == (llada_lm.config.n_heads, 11)
    changed = ids.clone()
    changed[0, 8] = 9  # a column it does not compute: stale below the refresh layer, fresh from it on
    stale = ElasticInputs(torch.tensor([[3, 4]]), torch.tensor([[3, 4]]), n)
    assert torch.allclose(llada_lm.forward_elastic(changed, cache, stale, real_from=[0]), full[:, [3, 4]], atol=1e-5)
    fresh = ElasticInputs(torch.tensor([[3, 4, 8]]), torch.tensor([[3, 4]]), 0)
    assert torch.allclose(llada_lm.forward_elastic(changed, cache, fresh, real_from=[0]),
                          llada_lm.forward(changed)[:, [3, 4]], atol=1e-5)


@pytest.mark.parametrize("method", ["elastic", "cai-elastic"])
def test_batch_invariance(lm, method):
    options = dict(elastic_gamma=GAMMA, elastic_window=WINDOW)
    alone = [run(lm, [prompt], method, **options)[0] for prompt in PROMPTS]
    together = run(lm, PROMPTS, method, batch_size=3, **options)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.trace.commit_step == b.trace.commit_step
    # Joining mid-flight: the second request is submitted after the first has taken two steps.
    engine = Engine(lm, max_batch=4)
    config = build_config(method, gen_length=GEN, block_length=BLOCK, early_stop=False, **options)
    first = engine.submit(PROMPTS[0], config)
    engine.step()
    engine.step()
    second = engine.submit(PROMPTS[1], config)
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert results[first].token_ids == alone[0].token_ids
    assert results[second].token_ids == alone[1].token_ids


def test_cai_elastic_runs_with_fewer_computed_pairs(deep_lm):
    cai = run(deep_lm, PROMPTS, "cai-elastic", elastic_gamma=GAMMA, elastic_window=WINDOW)
    assert all(len(r.token_ids) == GEN and deep_lm.config.mask_id not in r.token_ids for r in cai)
    assert all(r.computed_fraction < 1 for r in cai)  # the window, not the whole block, at most steps


@pytest.mark.parametrize("options, error", [
    (dict(elastic_gamma=0), "elastic_gamma must be in \\(0, 1\\]"),
    (dict(elastic_gamma=1.5), "elastic_gamma must be in \\(0, 1\\]"),
    (dict(elastic_window=0), "elastic_window must be a positive integer"),
    (dict(elastic_window=BLOCK + 1), f"elastic_window \\({BLOCK + 1}\\) is longer than the block \\({BLOCK}\\)"),
    (dict(elastic_layer=-1), "elastic_layer must be an integer >= 0"),
    (dict(elastic_layer=2), "elastic_layer \\(2\\) is beyond the model's layers .*has 2"),
    (dict(refresh_every=4), "cache 'elastic' with refresh_every=4 is not meaningful"),
])
def test_bad_settings_name_the_field(llada_lm, options, error):
    with pytest.raises(InputError, match=error):
        run(llada_lm, PROMPTS[:1], "elastic", **options)


def test_cai_exit_over_elastic_is_refused(llada_lm):
    with pytest.raises(InputError, match="cache 'elastic' with cai.grinding_action='exit' is not meaningful"):
        run(llada_lm, PROMPTS[:1], "cai-elastic", cai=dict(grinding_action="exit"))


@pytest.mark.parametrize("method", ["elastic", "cai-elastic"])
def test_block_causal_family_is_refused_naming_both(tmp_path, method):
    lm = caidllm.load(write_block_checkpoint(tmp_path / "sdar", "sdar"), device="cpu", dtype="float32")
    with pytest.raises(InputError, match="cache mode 'elastic' needs .*family 'sdar'.*block-causal"):
        run(lm, PROMPTS[:1], method)
