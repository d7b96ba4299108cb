"""Block diffusion in the engine: the exact block cache, parity with the official generators
(re-stated plainly in bd_reference.py), batch invariance, and the settings each family refuses."""

import pytest
import torch

import caidllm
from bd_reference import llada2_generate, llada21_generate, sdar_generate
from caidllm.decode.engine import Engine
from caidllm.decode.presets import build_config
from caidllm.errors import InputError
from caidllm.models.modes import Block, Full
from helpers.decoding import alone_static_joined

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19], list(range(20, 33))]


@pytest.fixture(scope="module")
def bd_lm(random_checkpoint):
    """A block-causal LLaDA-layout model whose head is sharpened (x12), so confidences spread over
    (0, 1) and threshold rules commit several tokens a step; its end token is one these weights
    predict often (188), so some answers end early."""
    folder = random_checkpoint(
        "llada",
        config_overrides={
            "caidllm_block_causal": True,
            "caidllm_block_lengths": [4, 8],
            "caidllm_max_length": 1020,
            "eos_token_id": 188,
        },
        seed=5,
    )
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    head = lm.model.model.transformer.ff_out.weight
    with torch.no_grad():
        head.mul_(12)
    return lm


def answer(result):
    """The answer's tokens up to and including its end token (as the official loops return them)."""
    return (
        result.token_ids[: result.answer_length + 1]
        if result.answer_length < len(result.token_ids)
        else result.token_ids
    )


@pytest.mark.parametrize(
    "method, block", [("vanilla", 8), ("cai", 8), ("llada2", 8), ("sdar", 4), ("sdar-static", 4)]
)
def test_block_cache_is_exact(bd_lm, method, block):
    """Cached decoding gives the tokens of recomputing the whole window every step."""
    runs = {
        cache: bd_lm.generate(
            PROMPTS, method=method, gen_length=16, block_length=block, cache=cache, early_stop=False
        )
        for cache in ("none", "block")
    }
    assert [r.token_ids for r in runs["block"]] == [r.token_ids for r in runs["none"]]
    assert [r.nfe for r in runs["block"]] == [r.nfe for r in runs["none"]]


def test_block_forward_matches_the_whole_window(bd_lm):
    """Model level: a full forward fills the cache; the next block's forward (folding the previous
    block's final K/V) gives the logits of a whole-window forward."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (2, 24), generator=g)
    cache = bd_lm.new_cache(2, 24)
    bd_lm.forward(ids, cache=cache, mode=Full(attention_block=8))
    changed = ids.clone()
    changed[:, 8:16] = torch.randint(3, 300, (2, 8), generator=g)  # block 1 completed with new tokens
    cached = bd_lm.forward(changed, cache=cache, mode=Block(start=16, end=24, attention_block=8, fold=8))
    whole = bd_lm.forward(changed, mode=Full(attention_block=8))[:, 16:24]
    assert torch.allclose(cached, whole, atol=1e-4)


@pytest.mark.parametrize("threshold", [0.95, 0.3])
def test_llada2_parity(bd_lm, threshold):
    stop = set(bd_lm.config.eos_ids)
    results = bd_lm.generate(PROMPTS, method="llada2", gen_length=24, block_length=8, threshold=threshold)
    for prompt, result in zip(PROMPTS, results):
        official = llada2_generate(
            bd_lm, prompt, gen_length=24, block_length=8, steps=8, threshold=threshold, stop_ids=stop
        )
        assert answer(result) == official


@pytest.mark.parametrize(
    "strategy, method", [("low_confidence_dynamic", "sdar"), ("low_confidence_static", "sdar-static")]
)
def test_sdar_parity(bd_lm, strategy, method):
    stop = set(bd_lm.config.eos_ids)
    # The static rule reads no threshold (giving it one is refused: methods.refuse_unread).
    threshold = dict(threshold=0.5) if strategy == "low_confidence_dynamic" else {}
    results = bd_lm.generate(PROMPTS, method=method, gen_length=16, block_length=4, **threshold)
    for prompt, result in zip(PROMPTS, results):
        official = sdar_generate(
            bd_lm,
            prompt,
            gen_length=16,
            block_length=4,
            denoising_steps=4,
            strategy=strategy,
            threshold=0.5,
            stop_ids=stop,
        )
        assert answer(result) == official


@pytest.mark.parametrize(
    "method, threshold, editing, post, early",
    [
        ("llada2.1", 0.95, 0.9, 16, False),
        ("llada2.1-quality", 0.7, 0.5, 16, True),
        ("llada2.1-speed", 0.5, 0.0, 16, True),
        ("llada2.1-quality", 0.7, 0.2, 1, True),
        ("llada2.1-speed", 0.5, 0.0, 0, False),
        ("llada2.1-speed", 0.5, 0.0, 2, False),
    ],
)
def test_llada21_editing_parity(bd_lm, method, threshold, editing, post, early):
    stop = set(bd_lm.config.eos_ids)
    results = bd_lm.generate(
        PROMPTS, method=method, gen_length=16, block_length=8, max_post_steps=post, editing_threshold=editing
    )
    for prompt, result in zip(PROMPTS, results):
        official = llada21_generate(
            bd_lm,
            prompt,
            gen_length=16,
            block_length=8,
            threshold=threshold,
            editing_threshold=editing,
            max_post_steps=post,
            stop_ids=stop,
            eos_early_stop=early,
        )
        assert answer(result) == official


def test_editing_streams_final_blocks_only(bd_lm):
    """A block that may still be edited is not streamed: each position is reported once, when its
    block is final, with its final token."""
    config = build_config("llada2.1-speed", gen_length=16, block_length=8, early_stop=False)
    engine = Engine(bd_lm, max_batch=1)
    engine.submit(PROMPTS[1], config)
    seen, silent_steps = {}, 0
    for event in engine.run():
        silent_steps += not event.positions
        for p, t in zip(event.positions, event.token_ids):
            assert p not in seen and t != bd_lm.config.mask_id
            seen[p] = t
        if event.finished:
            result = event.result
    assert silent_steps > 0 and [seen[p] for p in range(16)] == result.token_ids


@pytest.mark.parametrize("method", ["llada2", "cai"])
def test_batch_invariance(bd_lm, method):
    """A request's tokens alone, in a static batch, and joining a running batch mid-flight."""
    alone, static, joined = alone_static_joined(
        bd_lm, build_config(method, gen_length=16, block_length=8), PROMPTS
    )
    assert static == alone and joined == alone


def test_streamed_commits_are_answer_positions(bd_lm):
    """Events report only answer positions (never the prompt part of the first block, nor the
    positions past gen_length of the last one) and never a mask."""
    config = build_config("llada2", gen_length=16, block_length=8, early_stop=False)
    engine = Engine(bd_lm, max_batch=2)
    engine.submit(PROMPTS[0], config)
    seen = {}
    for event in engine.run():
        for p, t in zip(event.positions, event.token_ids):
            assert 0 <= p < 16 and p not in seen and t != bd_lm.config.mask_id
            seen[p] = t
        if event.finished:
            result = event.result
    assert sorted(seen) == list(range(16)) and [seen[p] for p in range(16)] == result.token_ids


@pytest.mark.parametrize(
    "options, needle",
    [
        (dict(method="cai", cache="dual"), "cache='dual' does not apply to the block-causal"),
        (dict(method="fastdllm", cache="prefix"), "cache='prefix' does not apply"),
        (dict(method="llada2", block_length=16), "block_length 16 is not one the llada model decodes with"),
        (dict(method="cai", refresh_every=4), "refresh_every does not apply"),
        (dict(method="llada2", minimal_topk=0), "minimal_topk"),
        (dict(method="llada2.1", editing_threshold=1.5), r"editing_threshold must be in \[0, 1\]"),
        (dict(method="llada2.1", editing_threshold=-0.1), r"editing_threshold must be in \[0, 1\]"),
        (dict(method="llada2.1", max_post_steps=-1), "max_post_steps"),
    ],
)
def test_block_causal_refusals(bd_lm, options, needle):
    options = {"block_length": 8, **options}
    with pytest.raises(InputError, match=needle):
        bd_lm.generate([PROMPTS[0]], gen_length=16, **options)


@pytest.mark.parametrize(
    "options, needle",
    [
        (dict(method="llada2"), "block-diffusion decoder; the llada model is full-sequence"),
        (dict(method="cai", cache="block"), "cache='block'"),
        (dict(method="vanilla", policy="static"), "block-diffusion decoder"),
        (dict(method="cai", editing_threshold=0.5), "editing_threshold"),
    ],
)
def test_full_sequence_refusals(llada_lm, options, needle):
    with pytest.raises(InputError, match=needle):
        llada_lm.generate([PROMPTS[0]], gen_length=16, block_length=8, **options)


def test_a_preset_cache_becomes_the_block_cache(bd_lm):
    """cai's preset cache (dual) does not apply: on a block-causal model it runs on the block cache."""
    dual_default = bd_lm.generate([PROMPTS[0]], method="cai", gen_length=16, block_length=8)
    block = bd_lm.generate([PROMPTS[0]], method="cai", gen_length=16, block_length=8, cache="block")
    assert dual_default[0].token_ids == block[0].token_ids


def test_context_counts_the_last_block(bd_lm):
    """The canvas runs to the end of the last block: the context check counts it."""
    limit = bd_lm.config.max_length
    prompt = [7] * (limit - 16 - 3)  # 1001 + 16 fit in 1020; laid out to a block end of 8 (1024) they do not
    with pytest.raises(InputError, match="laid out to the end of its last block"):
        bd_lm.generate([prompt], method="llada2", gen_length=16, block_length=8)
