"""Cache mode "prompt" (decode/caches/prompt.py), the worked example of docs/architecture/add-a-cache-mode.md:
dLLM-Cache's prompt cache. Its greedy output equals a plain re-statement (one prompt, the public forward:
a full forward at a block's first step and every f steps, else the generated region against the cached
prompt K/V); the cache is really read; batch invariance; the families it cannot run on are refused."""

import pytest
import torch

import caidllm
from block_checkpoints import write_block_checkpoint
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.sampling import predict
from caidllm.errors import InputError
from caidllm.models.modes import DKV
from helpers.decoding import BLOCK, GEN, PROMPTS, run

PROMPTS = PROMPTS[:3]


@pytest.fixture(scope="module")
def deep_llada(random_checkpoint):
    # Eight layers: a stale prompt then changes some greedy tokens.
    return caidllm.load(random_checkpoint("llada", n_layers=8), device="cpu", dtype="float32")


def prompt_cache_reference(lm, prompt, refresh, gen=GEN, block=BLOCK):
    """LLaDA's loop (steps = gen_length, one position a step, the most confident masked one of the block)."""
    mask = lm.config.mask_id
    p = len(prompt)
    x = torch.tensor([prompt + [mask] * gen])
    cache = lm.new_cache(1, x.shape[1])
    answer = torch.arange(p, p + gen)[None]
    for b in range(gen // block):
        lo, hi = p + b * block, p + (b + 1) * block
        for t in range(block):
            if t % refresh == 0:
                logits = lm.forward(x, cache=cache)  # a refresh: every K/V fresh, written into the cache
            else:
                logits = torch.zeros(1, x.shape[1], lm.config.vocab_size)
                logits[0, p:] = lm.forward(x, cache=cache, mode=DKV(columns=answer))[0]
            tokens, confidence = predict(logits.clone(), mask, 0.0, None)
            masked = [i for i in range(lo, hi) if x[0, i] == mask]
            best = max(masked, key=lambda i: (float(confidence[0, i]), -i))
            x[0, best] = tokens[0, best]
    return x[0, p:].tolist()


@pytest.mark.parametrize("refresh", [4, 100])
def test_prompt_cache_matches_its_plain_loop_and_reads_the_cache(deep_llada, refresh):
    results = run(deep_llada, PROMPTS, "vanilla", cache="prompt", refresh_every=refresh)
    for prompt, r in zip(PROMPTS, results):
        assert r.token_ids == prompt_cache_reference(deep_llada, prompt, refresh)
    if refresh == 100:  # one refresh a block: the stale prompt changes some tokens against no cache
        plain = run(deep_llada, PROMPTS, "vanilla")
        assert any(a.token_ids != b.token_ids for a, b in zip(results, plain))


def test_prompt_cache_batch_invariance(llada_lm):
    together = run(llada_lm, PROMPTS, "vanilla", cache="prompt", refresh_every=4, batch_size=3)
    for prompt, joint in zip(PROMPTS, together):
        (alone,) = run(llada_lm, [prompt], "vanilla", cache="prompt", refresh_every=4)
        assert alone.token_ids == joint.token_ids and alone.trace.commit_step == joint.trace.commit_step


def test_prompt_cache_is_refused_where_it_cannot_run(dream_lm, tmp_path):
    assert CACHE_MODES["prompt"].uses_cache
    with pytest.raises(InputError, match="cache mode 'prompt'.*family 'dream'"):
        run(dream_lm, PROMPTS[:1], "vanilla", cache="prompt")
    lm = caidllm.load(write_block_checkpoint(tmp_path / "sdar", "sdar"), device="cpu", dtype="float32")
    with pytest.raises(
        InputError, match="cache mode 'prompt' needs the dkv forward .*family 'sdar'.*block-causal"
    ):
        run(lm, PROMPTS[:1], "vanilla", cache="prompt")
