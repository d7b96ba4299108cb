"""EB-Sampler, SlowFast Sampling and WINO (decode/policies/eb.py, slowfast.py, wino.py):
each decoder's greedy output equals a plain re-statement of its rule (no engine, no batching,
one prompt at a time) token for token on random LLaDA and Dream weights (fp32); batch
invariance; bad settings."""

import statistics

import pytest
import torch

import caidllm
from caidllm.decode import build_config
from caidllm.decode.engine import Engine
from caidllm.decode.sampling import predict, token_probability
from caidllm.errors import InputError
from caidllm.models.shadow import shadow_inputs
from helpers.decoding import BLOCK, GEN, PROMPTS, run

PROMPTS = PROMPTS[:3]


@pytest.fixture(scope="module")
def tiny_lm():
    return caidllm.load("tiny", device="cpu", dtype="float32")


def step_predictions(lm, x):
    """Greedy tokens, confidences and the logits of every position of the unpadded canvas x [1, n]."""
    logits = lm.logits(x)
    tokens, confidence = predict(logits.clone(), lm.config.mask_id, 0.0, None)
    return tokens[0], confidence[0], logits[0]


# ---- plain re-statements of each decoder's loop (one prompt, whole canvas, no cache) --------------------


def eb_reference(lm, prompt, gamma, proxy="entropy", gen=GEN, block=BLOCK):
    """Algorithm 1 of the EB-Sampler paper: the masked positions in the proxy's order, the largest
    prefix whose entropies' sum minus their max is at most gamma."""
    mask = lm.config.mask_id
    x = torch.tensor([prompt + [mask] * gen])
    p = len(prompt)
    for b in range(gen // block):
        lo, hi = p + b * block, p + (b + 1) * block
        while (x[0, lo:hi] == mask).any():
            tokens, confidence, logits = step_predictions(lm, x)
            logits = logits.clone()
            logits[:, mask] = float("-inf")
            probs = torch.softmax(logits, -1)
            entropy = -(probs * torch.log(probs.clamp_min(1e-45))).sum(-1)
            second = probs.topk(2, dim=-1).values[:, 1]
            error = {"entropy": entropy, "confidence": 1 - confidence, "margin": 1 - (confidence - second)}[
                proxy
            ]
            masked = [i for i in range(lo, hi) if x[0, i] == mask]
            order = sorted(masked, key=lambda i: (float(error[i]), i))
            chosen = []
            for i in order:  # the prefix grows while sum - max of its entropies stays within gamma
                joined = [float(entropy[j]) for j in chosen + [i]]
                if chosen and sum(joined) - max(joined) > gamma:
                    break
                chosen.append(i)
            for i in chosen:
                x[0, i] = tokens[i]
    return x[0, p:].tolist()


def slowfast_reference(
    lm, prompt, gen=GEN, block=BLOCK, K=6, cycle=0.3, window=2, std=1.0, high=0.9, shortened=True
):
    """The official generate_slow_fast_sampling at batch size 1. Switch: `shortened` (as shipped) runs the
    fast phase's forwards after its first on the canvas up to the span's end; off, on the whole canvas
    (the `slowfast-whole` preset)."""
    mask = lm.config.mask_id
    x = torch.tensor([prompt + [mask] * gen])
    p = len(prompt)

    def fill(conf, lo, hi):
        span = [i for i in range(lo, hi) if x[0, p + i] == mask]
        confident = [i for i in span if conf[i] >= high]
        if len(confident) > 1:
            return confident
        return [max(span, key=lambda i: (conf[i], -i))] if span else []

    for b in range(gen // block):
        start, end = b * block, (b + 1) * block
        cur, last = block, 0
        while (x[0, p + start : p + end] == mask).any():
            history, fixed = [], False
            for k in range(K):
                tokens, confidence, _ = step_predictions(lm, x)
                conf = {
                    i: float(confidence[p + i]) if x[0, p + i] == mask else float("-inf") for i in range(gen)
                }
                if not fixed:
                    lo = start + last
                    if lo < end:
                        reach = [i - lo for i in range(lo, end) if conf[i] >= cycle]
                        increment = max(reach) + 1 if reach else 1
                    else:
                        increment = 0
                    history = (history + [min(max(1, last + increment), block)])[-window:]
                    if len(history) >= window:
                        if statistics.pstdev(history) < std:
                            cur, fixed = history[-1], True
                        else:
                            cur, fixed = max(1, min(int(statistics.mean(history)), block)), k == K - 1
                for i in fill(conf, start + last, end):
                    x[0, p + i] = tokens[p + i]
            if not fixed:
                cur = max(1, min(int(statistics.mean(history)), block)) if history else block // 2
            fast_calls = 0
            while any(x[0, p + i] == mask for i in range(start + last, start + cur)):
                upto = p + start + cur if shortened and fast_calls else x.shape[1]
                tokens, confidence, _ = step_predictions(lm, x[:, :upto])
                fast_calls += 1
                conf = {
                    i: float(confidence[p + i]) if p + i < upto and x[0, p + i] == mask else float("-inf")
                    for i in range(gen)
                }
                for i in fill(conf, start + last, start + cur):
                    x[0, p + i] = tokens[p + i]
            last = cur
    return x[0, p:].tolist()


def wino_reference(lm, prompt, gen=GEN, block=BLOCK, draft=0.6, verify=0.9):
    """The official decoding_wino (LLaDA/decoding.py) at batch size 1."""
    mask = lm.config.mask_id
    x = torch.tensor(prompt + [mask] * gen)
    p = len(prompt)
    for b in range(gen // block):
        lo = p + b * block
        ids, positions, attention, targets = shadow_inputs(x, lo, block, mask)
        last_accept = 30
        while (x[lo : lo + block] == mask).any():
            ids[0, : len(x)] = x
            logits = lm.forward_with_attention(ids, positions, attention, targets)[0]
            tokens, confidence = predict(logits[:block].clone(), mask, 0.0, None)
            current = x[lo : lo + block]
            support = token_probability(logits[block:], current, mask)
            masked = current == mask
            n_masked = int(masked.sum())
            max_accept = min(max(int(n_masked * 0.7), 5), 20)
            conf = torch.where(masked, confidence, torch.tensor(float("-inf")))
            transfer = conf > draft
            if int(transfer.sum()) > max_accept:
                transfer = torch.zeros_like(transfer)
                transfer[torch.topk(conf, max_accept).indices] = True
            elif not transfer.any():
                transfer[torch.argmax(conf)] = True
            back = torch.where(~masked, support, torch.tensor(float("inf")))
            remask = torch.zeros_like(transfer)
            if int(transfer.sum()) > 1:
                remask = back < verify
                if int(remask.sum()) >= last_accept:
                    remask = torch.zeros_like(transfer)
                    remask[torch.topk(back, last_accept - 1, largest=False).indices] = True
            new = torch.where(transfer, tokens, current)
            new[remask] = mask
            x[lo : lo + block] = new
            last_accept = int(transfer.sum())
    return x[p:].tolist()


# ---- parity ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("proxy", ["entropy", "confidence", "margin"])
@pytest.mark.parametrize("gamma", [0.0, 0.01, 20.0])
def test_eb_matches_its_plain_loop(lm, gamma, proxy):
    results = run(lm, PROMPTS, "eb", eb_gamma=gamma, eb_proxy=proxy)
    for prompt, r in zip(PROMPTS, results):
        assert r.token_ids == eb_reference(lm, prompt, gamma, proxy)
    if gamma == 0.0:  # one position per step
        assert all(r.nfe == GEN for r in results)
    if gamma == 20.0:  # random weights: entropies near log(vocab)
        assert sum(r.nfe for r in results) < len(PROMPTS) * GEN  # several tokens per step somewhere


@pytest.mark.parametrize("method, shortened", [("slowfast", True), ("slowfast-whole", False)])
def test_slowfast_matches_the_official_loop(lm, method, shortened):
    for prompt, r in zip(PROMPTS, run(lm, PROMPTS, method)):
        assert r.token_ids == slowfast_reference(lm, prompt, shortened=shortened)


def test_slowfast_on_tiny_both_readings_match_and_differ(tiny_lm):
    texts = ("not ( True ) and ( True ) is", "True and not False or ( False ) is", "7 + 5 * 3 =")
    prompts = [tiny_lm.encode_chat(text) for text in texts]
    outputs = {}
    for method, shortened in (("slowfast", True), ("slowfast-whole", False)):
        # One exploratory step, a window of one: short sub-cycles, so fast phases with several forwards.
        results = run(
            tiny_lm, prompts, method, gen_length=64, block_length=32, sf_explore_steps=1, sf_window=1
        )
        for prompt, r in zip(prompts, results):
            assert r.token_ids == slowfast_reference(
                tiny_lm, prompt, gen=64, block=32, K=1, window=1, shortened=shortened
            )
        outputs[method] = [(r.token_ids, r.nfe) for r in results]
    assert outputs["slowfast"] != outputs["slowfast-whole"]  # the shortened forwards change the decoding here


@pytest.mark.parametrize("draft, verify", [(0.6, 0.9), (0.02, 0.5)])
def test_wino_matches_the_official_loop(llada_lm, draft, verify):
    results = run(llada_lm, PROMPTS, "wino", wino_draft=draft, wino_verify=verify)
    for prompt, r in zip(PROMPTS, results):
        assert r.token_ids == wino_reference(llada_lm, prompt, draft=draft, verify=verify)
        assert llada_lm.config.mask_id not in r.token_ids


# ---- engine behaviour ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["eb", "eb-dual", "slowfast", "slowfast-whole"])
def test_batch_invariance(lm, method):
    together = run(lm, PROMPTS, method, eb_gamma=0.5, batch_size=3)
    for prompt, joint in zip(PROMPTS, together):
        (alone,) = run(lm, [prompt], method, eb_gamma=0.5)
        assert alone.token_ids == joint.token_ids and alone.nfe == joint.nfe
        assert alone.trace.commit_step == joint.trace.commit_step


def test_shortened_slowfast_rows_beside_other_policies_keep_their_tokens(tiny_lm):
    """SlowFast's shortened forwards never share a forward with other rows (scheduler): in one engine with
    EB-Sampler and whole-canvas SlowFast requests, each gives its tokens alone."""
    prompts = [tiny_lm.encode_chat(text) for text in ("7 + 5 * 3 =", "True and not False or ( False ) is")]
    options = dict(gen_length=64, block_length=32, early_stop=False, sf_explore_steps=1, sf_window=1)
    engine = Engine(tiny_lm, max_batch=6)
    wanted, ids = {}, []
    for method in ("slowfast", "slowfast-whole", "eb"):
        for prompt in prompts:
            ids.append(engine.submit(prompt, build_config(method, **options)))
            wanted[ids[-1]] = run(tiny_lm, [prompt], method, **options)[0].token_ids
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert all(results[i].token_ids == wanted[i] for i in ids)


def joining_mid_flight(lm, method, **kw):
    """Two requests in flight, a third submitted after two steps: each equals its run alone."""
    config = build_config(method, gen_length=GEN, block_length=BLOCK, early_stop=False, **kw)
    engine = Engine(lm, max_batch=3)
    ids = [engine.submit(p, config) for p in PROMPTS[:2]]
    events = engine.step() + engine.step()
    ids.append(engine.submit(PROMPTS[2], config))
    events += list(engine.run())
    results = {e.request_id: e.result for e in events if e.finished}
    return [results[i] for i in ids], events


@pytest.mark.parametrize("method", ["eb", "eb-dual", "slowfast", "wino", "dkv"])
def test_joining_mid_flight_equals_alone(llada_lm, method):
    joint, _ = joining_mid_flight(llada_lm, method)
    for prompt, r in zip(PROMPTS, joint):
        (alone,) = run(llada_lm, [prompt], method)
        assert alone.token_ids == r.token_ids and alone.nfe == r.nfe


def test_wino_streams_only_final_blocks(llada_lm):
    # Low thresholds draft many tokens and re-mask some: still, each block is reported once, whole.
    _, events = joining_mid_flight(llada_lm, "wino", wino_draft=0.02, wino_verify=0.5)
    seen = {}
    for e in events:
        if e.positions:
            assert len(e.positions) == BLOCK and e.positions[0] % BLOCK == 0
            assert e.positions == list(range(e.positions[0], e.positions[0] + BLOCK))
            assert llada_lm.config.mask_id not in e.token_ids
            key = (e.request_id, e.positions[0])
            assert key not in seen  # never sent twice, never taken back
            seen[key] = e.token_ids
    assert len(seen) == len(PROMPTS) * GEN // BLOCK


def test_wino_revises(llada_lm, monkeypatch):
    # With a low draft threshold some drafted tokens fail verification and go back to the mask.
    import dataclasses

    from caidllm.decode.policies import POLICIES, wino

    remasked = []

    def counting(view, **kw):
        commit = wino.select(view, **kw)
        remasked.append(int(view.remask.sum()))
        return commit

    monkeypatch.setitem(POLICIES, "wino", dataclasses.replace(POLICIES["wino"], select=counting))
    results = run(llada_lm, PROMPTS, "wino", wino_draft=0.02, wino_verify=0.5)
    assert sum(remasked) > 0
    assert all(llada_lm.config.mask_id not in r.token_ids for r in results)


# ---- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, kwargs, message",
    [
        ("eb", dict(eb_gamma=-1.0), "eb_gamma must be a number >= 0 (0: one position per step), got -1.0"),
        ("eb", dict(eb_gamma=float("nan")), "eb_gamma must be a number >= 0"),
        (
            "eb",
            dict(eb_proxy="perplexity"),
            "eb_proxy must be one of entropy, confidence, margin, got 'perplexity'",
        ),
        ("wino", dict(wino_draft=0.95, wino_verify=0.9), "WINO thresholds out of order"),
        ("wino", dict(wino_verify=1.5), "wino_verify must be in (0, 1]"),
        ("wino", dict(cache="dual"), "policy 'wino' with cache='dual' is not meaningful"),
        (
            "slowfast",
            dict(sf_window=BLOCK + 1),
            f"sf_window ({BLOCK + 1}) is longer than the block ({BLOCK})",
        ),
        ("slowfast", dict(sf_explore_steps=0), "sf_explore_steps must be a positive integer"),
        ("slowfast", dict(sf_std=0), "sf_std must be a positive number"),
    ],
)
def test_bad_settings(llada_lm, method, kwargs, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(llada_lm, PROMPTS[:1], method, **kwargs)


def test_wino_on_a_family_without_its_forward_is_refused(dream_lm):
    with pytest.raises(InputError, match="policy 'wino' needs the verify forward.*family 'dream'"):
        run(dream_lm, PROMPTS[:1], "wino")
