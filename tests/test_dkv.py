"""dKV-Cache-Decode (cache mode "dkv", decode/forward_modes.py): the engine's greedy output equals a plain
re-statement of the official LLaDA loop (no engine, no batching) token for token; the dkv forward
itself; batch invariance; refusal on Dream."""

import pytest
import torch

import caidllm
from block_checkpoints import write_block_checkpoint
from caidllm.decode.policies.vanilla import tokens_at_step
from caidllm.decode.sampling import predict, request_generator
from caidllm.errors import InputError
from caidllm.models.modes import DKV
from helpers.decoding import BLOCK, GEN, PROMPTS, run

PROMPTS = PROMPTS[:3]


@pytest.fixture(scope="module")
def deep_llada(random_checkpoint):
    # Eight layers: stale keys and values of decoded tokens then change some greedy tokens.
    return caidllm.load(random_checkpoint("llada", n_layers=8), device="cpu", dtype="float32")


def dkv_reference(lm, prompt, refresh, steps, gen=GEN, block=BLOCK):
    """The official dKV-Cache-Decode generate at batch size 1: full forwards at steps 0 and 1 of a
    block and every `refresh` steps; otherwise only the positions not yet decoded two steps ago."""
    mask = lm.config.mask_id
    p = len(prompt)
    x = torch.tensor([prompt + [mask] * gen])
    cache = lm.new_cache(1, x.shape[1])
    T = steps // (gen // block)
    for b in range(gen // block):
        lo, hi = p + b * block, p + (b + 1) * block
        n_masked = torch.tensor([int((x[0, lo:hi] == mask).sum())])
        before_previous = decoded = None
        for i in range(T):
            if i % refresh != 0 and i > 1:
                columns = (~before_previous).nonzero()[:, 1][None]
                some = lm.forward(x, cache=cache, mode=DKV(columns=columns))
                logits = torch.zeros(1, x.shape[1], some.shape[-1])
                logits[0, columns[0]] = some[0]
            else:
                logits = lm.forward(x, cache=cache)
            tokens, confidence = predict(logits[:, lo:hi].clone(), mask, 0.0, None)
            masked = x[0, lo:hi] == mask
            k = int(tokens_at_step(n_masked, i, T))
            conf = torch.where(masked, confidence[0], torch.tensor(float("-inf")))
            chosen = torch.topk(conf, k).indices if k else torch.tensor([], dtype=torch.long)
            x[0, lo + chosen] = tokens[0, chosen]
            before_previous, decoded = decoded, x != mask
    return x[0, p:].tolist()


@pytest.mark.parametrize("refresh, steps", [(3, GEN), (100, GEN // 2)])
def test_dkv_matches_the_official_loop(deep_llada, refresh, steps):
    results = run(deep_llada, PROMPTS, "dkv", refresh_every=refresh, steps=steps)
    for prompt, r in zip(PROMPTS, results):
        assert r.token_ids == dkv_reference(deep_llada, prompt, refresh, steps)
    plain = run(deep_llada, PROMPTS, "vanilla", steps=steps)
    assert any(a.token_ids != b.token_ids for a, b in zip(results, plain))  # the cache is really used


def test_dkv_forward_right_after_a_refresh_equals_full(llada_lm):
    ids = torch.tensor([[5, 6, 7] + [llada_lm.config.mask_id] * 8])
    cache = llada_lm.new_cache(1, ids.shape[1])
    full = llada_lm.forward(ids, cache=cache)
    columns = torch.tensor([[1, 4, 5, 9]])
    some = llada_lm.forward(ids, cache=cache, mode=DKV(columns=columns))
    assert torch.allclose(some, full[:, columns[0]], atol=1e-5)


def test_dkv_forward_reads_the_cache_for_columns_it_does_not_compute(llada_lm):
    mask = llada_lm.config.mask_id
    ids = torch.tensor([[5, 6, 7] + [mask] * 8])
    cache = llada_lm.new_cache(1, ids.shape[1])
    llada_lm.forward(ids, cache=cache)
    columns = torch.tensor([[6, 7, 8, 9, 10]])
    before = llada_lm.forward(ids, cache=cache, mode=DKV(columns=columns))
    changed = ids.clone()
    changed[0, 3:5] = torch.tensor([40, 41])  # "decoded" two steps ago: not recomputed
    after = llada_lm.forward(changed, cache=cache, mode=DKV(columns=columns))
    assert torch.equal(before, after)
    assert not torch.allclose(after, llada_lm.forward(changed)[:, columns[0]], atol=1e-4)


def test_batch_invariance(llada_lm):
    together = run(llada_lm, PROMPTS, "dkv", refresh_every=4, batch_size=3)
    for prompt, joint in zip(PROMPTS, together):
        (alone,) = run(llada_lm, [prompt], "dkv", refresh_every=4)
        assert alone.token_ids == joint.token_ids and alone.trace.commit_step == joint.trace.commit_step


def test_dkv_on_dream_is_refused_naming_both(dream_lm):
    with pytest.raises(InputError, match="cache mode 'dkv'.*family 'dream'"):
        run(dream_lm, PROMPTS[:1], "dkv")


@pytest.mark.parametrize("method, needs", [("dkv", "cache mode 'dkv'"), ("wino", "policy 'wino'")])
def test_block_causal_family_is_refused_naming_both(tmp_path, method, needs):
    lm = caidllm.load(write_block_checkpoint(tmp_path / "sdar", "sdar"), device="cpu", dtype="float32")
    with pytest.raises(InputError, match=f"{needs} needs .*family 'sdar'.*block-causal"):
        run(lm, PROMPTS[:1], method)


# ---- dKV-Cache-Greedy (cache "dkv-greedy" with policy "random") -------------------------------------------


def greedy_reference(lm, prompt, refresh, window, seed, gen=GEN, block=BLOCK):
    """The official dKV-Cache-Greedy generate at batch size 1 (random remasking): each block's positions
    are decoded in a random order drawn at its start, the linear schedule's share per step; full forwards
    at steps 0, f, 2f ...; otherwise only the columns chosen at the previous step: the positions this step
    decodes, those the previous step decoded, and up to `window` masked neighbours of each of the former
    (nearest first, left then right, masked before the previous step's commits)."""
    mask = lm.config.mask_id
    p = len(prompt)
    x = torch.tensor([prompt + [mask] * gen])
    cache = lm.new_cache(1, x.shape[1])
    generator = request_generator(seed, prompt, "cpu")
    T = steps = GEN // (gen // block)
    for b in range(gen // block):
        lo = p + b * block
        draws = torch.rand(block, generator=generator, dtype=torch.float64)
        order = [lo + i for i in torch.sort(draws, descending=True, stable=True).indices.tolist()]
        shares = [block // T + (i < block % T) for i in range(T)]
        starts = [sum(shares[:i]) for i in range(T + 1)]
        planned = None
        for i in range(steps):
            masked_now = set((x[0] == mask).nonzero()[:, 0].tolist())
            if i % refresh != 0:
                columns = torch.tensor([sorted(planned)])
                some = lm.forward(x, cache=cache, mode=DKV(columns=columns))
                logits = torch.zeros(1, x.shape[1], some.shape[-1])
                logits[0, columns[0]] = some[0]
            else:
                logits = lm.forward(x, cache=cache)
            tokens, _ = predict(logits.clone(), mask, 0.0, None)
            now = order[starts[i] : starts[i + 1]]
            x[0, now] = tokens[0, now]
            if i < steps - 1:
                upcoming = order[starts[i + 1] : starts[i + 2]]
                planned = set(upcoming) | set(now)
                for c in upcoming:
                    left, right, found, go_left = c - 1, c + 1, 0, True
                    while found < window and (left >= 0 or right < x.shape[1]):
                        if go_left:
                            if left >= 0 and left not in planned and left in masked_now:
                                planned.add(left)
                                found += 1
                            left -= 1
                        else:
                            if right < x.shape[1] and right not in planned and right in masked_now:
                                planned.add(right)
                                found += 1
                            right += 1
                        go_left = not go_left
    return x[0, p:].tolist()


@pytest.mark.parametrize("refresh, window", [(4, 1), (100, 2)])
def test_greedy_matches_the_official_loop(deep_llada, refresh, window):
    results = run(deep_llada, PROMPTS, "dkv-greedy", refresh_every=refresh, dkv_window=window, seed=3)
    for prompt, r in zip(PROMPTS, results):
        assert r.token_ids == greedy_reference(deep_llada, prompt, refresh, window, 3)
    plain = run(deep_llada, PROMPTS, "dkv-greedy", cache="none", seed=3)  # the same random order, no cache
    assert any(a.token_ids != b.token_ids for a, b in zip(results, plain))  # the cache is really used


def test_greedy_batch_invariance(llada_lm):
    together = run(llada_lm, PROMPTS, "dkv-greedy", refresh_every=4, seed=5, batch_size=3)
    for prompt, joint in zip(PROMPTS, together):
        (alone,) = run(llada_lm, [prompt], "dkv-greedy", refresh_every=4, seed=5)
        assert alone.token_ids == joint.token_ids and alone.trace.commit_step == joint.trace.commit_step


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(policy="vanilla"), "cache 'dkv-greedy' with policy 'vanilla' is not meaningful"),
        (dict(dkv_window=-1), "dkv_window must be an integer >= 0"),
        (dict(dkv_window=BLOCK + 1), f"dkv_window \\({BLOCK + 1}\\) is longer than the block \\({BLOCK}\\)"),
    ],
)
def test_greedy_bad_settings(llada_lm, options, error):
    with pytest.raises(InputError, match=error):
        run(llada_lm, PROMPTS[:1], "dkv-greedy", **options)


def test_greedy_on_dream_is_refused_naming_both(dream_lm):
    with pytest.raises(InputError, match="cache mode 'dkv-greedy'.*family 'dream'"):
        run(dream_lm, PROMPTS[:1], "dkv-greedy")
