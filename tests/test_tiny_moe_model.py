"""The shipped MoE block-diffusion model tiny-moe (src/caidllm/assets/tiny-moe, MODEL_CARD.md):
it loads by name through the real LLaDA2 family (QK-norm, partial rotary, a dense first layer,
sigmoid group-limited routing with a trained expert bias, a shared expert), answers BBH-style
questions, really uses its experts, decodes batch-invariantly with thresholds that fire, and
its bad settings are refused with one line."""

import pytest
import torch

import caidllm
from caidllm.cli import main
from caidllm.decode.engine import Engine
from caidllm.decode.presets import build_config
from caidllm.models.llada2 import LLaDA2Model
from caidllm.tasks import score
from caidllm.train.bd_decode import block_diffusion_generate
from caidllm.train.moe_balance import ExpertCounter

BOOLEAN = "not ( True ) and ( True ) is"
WEB = (
    "Question: Sherrie tells the truth. Vernell says Sherrie tells the truth. Alexis says Vernell lies. "
    "Michaela says Alexis tells the truth. Elanor says Michaela tells the truth. Does Elanor tell the truth?"
)
MORE = ["True and not not ( not False ) is", "not True or ( False and True ) is"]


@pytest.fixture(scope="module")
def tiny_moe():
    return caidllm.load("tiny-moe", device="cpu")


def test_tiny_moe_loads_through_the_llada2_family(tiny_moe):
    c = tiny_moe.config
    assert (
        c.family == "llada2" and isinstance(tiny_moe.model, LLaDA2Model) and tiny_moe.path.name == "tiny-moe"
    )
    assert c.block_causal and c.block_lengths == (4, 8, 16, 32)
    assert c.qk_norm and c.head_dim == 128 and c.rotary_dim == 64 and c.dense_layers == 1
    moe = c.moe
    assert (moe.score_function, moe.num_experts, moe.num_experts_per_tok, moe.n_group, moe.topk_group) == (
        "sigmoid",
        8,
        2,
        4,
        2,
    )
    assert moe.expert_bias and moe.num_shared_experts == 3 and moe.routed_scaling_factor == 2.5
    layers = tiny_moe.model.model.layers
    assert not hasattr(layers[0].mlp, "gate") and all(hasattr(layer.mlp, "experts") for layer in layers[1:])
    # The balancing of training moved every router's expert bias (LLaDA2's auxiliary-loss-free rule).
    assert all(layer.mlp.gate.expert_bias.abs().max() > 0 for layer in layers[1:])
    assert len(tiny_moe.tokenizer) == len(caidllm.load("tiny").tokenizer)


def test_tiny_moe_answers_with_the_plain_block_decoder(tiny_moe):
    """Block 8 only (block 32 is the engine's tests below; one token per forward is slow here)."""
    boolean, web = block_diffusion_generate(tiny_moe, [BOOLEAN, WEB], 8, gen_length=128)
    assert score("boolean_expressions", boolean, "False") and score("web_of_lies", web, "No")


def test_tiny_moe_generates_these_tokens(tiny_moe):
    """The engine's llada2 decoder (threshold 0.95) on the block cache: exact tokens, recorded
    from the shipped weights, fewer forwards than tokens (the threshold fires)."""
    (result,) = tiny_moe.generate([BOOLEAN], method="llada2", gen_length=32, block_length=8)
    assert result.token_ids[: result.answer_length] == EXPECTED_TOKENS
    assert result.text.startswith(BOOLEAN.removesuffix(" is") + "\n= ")
    assert result.nfe == 7 and result.answer_length == 32


# `not ( True ) and ( True )\n= not True and ( True )\n= not True and True\n= False and True\n= False\nSo`
# in 10 forwards (recorded from the shipped weights)
EXPECTED_TOKENS = [
    596,
    262,
    361,
    263,
    376,
    262,
    361,
    263,
    204,
    34,
    455,
    361,
    376,
    262,
    361,
    263,
    204,
    34,
    455,
    361,
    376,
    361,
    204,
    34,
    298,
    376,
    361,
    204,
    34,
    298,
    204,
    553,
]


def test_the_experts_are_all_used_and_unevenly(tiny_moe):
    """Routing is really used: over a few answers every expert of every MoE layer gets tokens,
    their loads differ, and silencing one expert changes the answer's logits."""
    counter = ExpertCounter(tiny_moe.model)
    try:
        tiny_moe.generate([BOOLEAN, WEB] + MORE, method="llada2", gen_length=64, block_length=8)
    finally:
        counter.detach()
    for shares in counter.shares():
        assert min(shares) > 0 and max(shares) > 1.5 * min(shares)
    ids = torch.tensor([tiny_moe.encode_chat(BOOLEAN)])
    with torch.no_grad():
        before = tiny_moe.model(ids)
        weight = tiny_moe.model.model.layers[1].mlp.experts.down_proj[0]  # expert 0 of the stacked experts
        saved = weight.clone()
        weight.zero_()
        try:
            after = tiny_moe.model(ids)
        finally:
            weight.copy_(saved)
    assert (before - after).abs().max() > 1e-3


def _run(engine):
    return {e.request_id: e.result for e in engine.run() if e.finished}


@pytest.mark.parametrize("method", ["llada2", "cai"])
def test_batch_invariance_with_thresholds_that_fire(tiny_moe, method):
    """Alone, in a static batch, and joining a running batch mid-flight: the same tokens; the
    trained model's confidences make the thresholds commit several tokens per forward."""
    prompts = [tiny_moe.encode_chat(p) for p in [BOOLEAN, MORE[0], MORE[1]]]
    config = build_config(method, gen_length=32, block_length=8)
    alone = []
    for prompt in prompts:
        engine = Engine(tiny_moe, max_batch=1)
        rid = engine.submit(prompt, config)
        result = _run(engine)[rid]
        assert result.nfe < result.answer_length  # several tokens per forward
        alone.append(result.token_ids)
    engine = Engine(tiny_moe, max_batch=4)
    ids = [engine.submit(p, config) for p in prompts]
    static = _run(engine)
    assert [static[i].token_ids for i in ids] == alone
    engine = Engine(tiny_moe, max_batch=4)
    first = engine.submit(prompts[2], config)
    engine.step()
    engine.step()
    late = [engine.submit(p, config) for p in prompts[:2]]
    joined = _run(engine)
    assert [joined[i].token_ids for i in late + [first]] == alone


@pytest.mark.parametrize(
    "args, words",
    [
        (["--cache", "dual"], "cache='dual' does not apply to the block-causal"),
        (["--block-length", "64", "--gen-length", "64"], "block_length 64 is not one"),
    ],
)
def test_bad_settings_are_one_line(capsys, args, words):
    code = main(
        ["generate", BOOLEAN, "--model", "tiny-moe", "--gen-length", "16", "--block-length", "8", *args]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1
