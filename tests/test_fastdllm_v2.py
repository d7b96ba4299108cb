"""Fast-dLLM v2 (models/fastdllm_v2.py, its decoder policies/subblock.py, its within-block cache
models/sub_block.py) against a plain re-statement of the official forward and generator
(fdv2_reference.py) on a tiny random checkpoint in the official layout (fp32)."""

import pytest
import torch

import caidllm
from block_checkpoints import write_block_checkpoint
from caidllm.decode.presets import build_config
from caidllm.errors import InputError
from fdv2_reference import OfficialFastDLLMv2
from helpers.decoding import alone_static_joined

# Below a block, a block and a part, and two whole blocks (the next token from the prefill).
PROMPTS = [[40, 41, 42, 43, 44], list(range(50, 70)), list(range(80, 112))]
GEN, BLOCK, SUB = 32, 16, 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_block_checkpoint(
        tmp_path_factory.mktemp("fdv2"),
        "fastdllm_v2",
        seed=3,
        head_scale=6.0,
        config_overrides={"bd_size": BLOCK},
    )


@pytest.fixture(scope="module")
def lm(folder):
    return caidllm.load(folder, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def official(folder):
    return OfficialFastDLLMv2(folder)


def answer(result):
    return (
        result.token_ids[: result.answer_length + 1]
        if result.answer_length < len(result.token_ids)
        else result.token_ids
    )


def test_logits_match_the_official_forward(lm, official):
    """Position i's logit is the official raw logit of i - 1 (the shift undone; position 0 its own),
    under block-causal attention."""
    ids = torch.tensor(list(range(60, 100)))
    raw = official.forward(ids, block_size=BLOCK)
    aligned = torch.cat([raw[:1], raw[:-1]])
    ours = lm.logits(ids[None])[0]
    torch.testing.assert_close(ours, aligned, rtol=1e-4, atol=1e-4)
    # A later block never changes an earlier one's logits.
    assert torch.allclose(lm.logits(ids[None, :32])[0], ours[:32], atol=1e-5)


@pytest.mark.parametrize("cache, use_block_cache", [("subblock", True), ("block", False), ("none", False)])
@pytest.mark.parametrize("threshold", [0.9, 0.3])
def test_official_generator_parity(lm, official, cache, use_block_cache, threshold):
    stop = set(lm.config.eos_ids)
    results = lm.generate(
        PROMPTS,
        method="fastdllm-v2",
        gen_length=GEN,
        block_length=BLOCK,
        sub_block=SUB,
        threshold=threshold,
        cache=cache,
    )
    for prompt, result in zip(PROMPTS, results):
        ref = official.generate(
            prompt,
            GEN,
            threshold=threshold,
            small_block_size=SUB,
            block_size=BLOCK,
            stop_ids=stop,
            use_block_cache=use_block_cache,
        )
        # the official runs one token past a block
        ours, n = (
            answer(result),
            min(len(answer(result)), len(ref)),
        )
        assert ours[:n] == ref[:n]
        if ref[-1] in stop and len(ref) <= GEN:
            assert ours == ref


def test_the_within_block_cache_saves_work(lm):
    runs = {
        cache: lm.generate(
            PROMPTS,
            method="fastdllm-v2",
            gen_length=GEN,
            block_length=BLOCK,
            sub_block=SUB,
            threshold=0.9,
            cache=cache,
            early_stop=False,
        )
        for cache in ("subblock", "block")
    }
    assert all(r.computed_fraction < 1.0 for r in runs["subblock"])
    assert all(r.computed_fraction == 1.0 for r in runs["block"])


@pytest.mark.parametrize("method", ["fastdllm-v2", "vanilla", "cai"])
def test_batch_invariance(lm, method):
    """Tokens alone, in a static batch, and joining a running batch mid-flight."""
    config = build_config(method, gen_length=GEN, block_length=BLOCK, sub_block=SUB, threshold=0.3)
    alone, static, joined = alone_static_joined(lm, config, PROMPTS)
    assert static == alone and joined == alone


def test_official_defaults():
    config = build_config("fastdllm-v2")
    own = config.policy_settings
    assert (config.block_length, own.sub_block, own.threshold, config.cache) == (32, 8, 0.9, "subblock")


@pytest.mark.parametrize(
    "options, needle",
    [
        (dict(sub_block=5), r"sub_block \(5\) must divide block_length \(16\)"),
        (dict(sub_block=0), "sub_block must be a positive integer"),
        (dict(cache="dual"), "cache='dual' does not apply to the block-causal"),
        (dict(method="cai", cache="subblock"), "cache 'subblock' with policy 'cai'"),
        (dict(block_length=8), "block_length 8 is not one the fastdllm_v2 model decodes with"),
    ],
)
def test_refusals(lm, options, needle):
    options = {"method": "fastdllm-v2", "block_length": BLOCK, **options}
    with pytest.raises(InputError, match=needle):
        lm.generate([PROMPTS[0]], gen_length=GEN, **options)


def test_full_sequence_models_refuse_it(llada_lm):
    with pytest.raises(InputError, match="block-diffusion decoder"):
        llada_lm.generate([[5, 6, 7]], method="fastdllm-v2", gen_length=32)
    with pytest.raises(InputError, match="cache 'subblock' with policy 'cai'"):
        llada_lm.generate([[5, 6, 7]], method="cai", cache="subblock", gen_length=32, block_length=32)


def test_random_shapes_and_tokenizer():
    lm = caidllm.load("random:fastdllm-v2-1.5b", device="meta")
    assert lm.config.family == "fastdllm_v2" and lm.config.block_lengths == (32,) and lm.config.tie_embeddings
    assert sum(p.numel() for p in lm.model.parameters()) == 1_543_714_304  # Qwen2.5-1.5B's
    lm7 = caidllm.load("random:fastdllm-v2-7b", device="meta")
    assert sum(p.numel() for p in lm7.model.parameters()) == 7_615_616_512  # Qwen2.5-7B's
    text = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert lm.tokenizer.convert_ids_to_tokens(lm.config.mask_id) == "|<MASK>|"
    assert lm.tokenizer.convert_tokens_to_ids("<|im_end|>") in lm.config.eos_ids


def test_official_defaults_parity(tmp_path):
    """The preset as it ships (block 32, sub-blocks of 8, threshold 0.9, the within-block cache) on a
    checkpoint with the official bd_size, against the official generator with use_block_cache."""
    folder = write_block_checkpoint(tmp_path / "fd32", "fastdllm_v2", seed=9, head_scale=8.0)
    lm, official = caidllm.load(folder, device="cpu", dtype="float32"), OfficialFastDLLMv2(folder)
    prompts = [[40, 41, 42], list(range(60, 100)), list(range(100, 164))]
    stop = set(lm.config.eos_ids)
    for prompt, result in zip(prompts, lm.generate(prompts, method="fastdllm-v2", gen_length=64)):
        ref = official.generate(
            prompt, 64, threshold=0.9, small_block_size=8, block_size=32, stop_ids=stop, use_block_cache=True
        )
        ours = answer(result)
        n = min(len(ours), len(ref))
        assert n > 0 and ours[:n] == ref[:n]
