"""The shipped block-diffusion model tiny-bd (src/caidllm/assets/tiny-bd, MODEL_CARD.md):
it loads by name like tiny, says it is block-causal, and answers BBH-style questions."""

import pytest

import caidllm
from caidllm.tasks import score
from caidllm.train.bd_decode import block_diffusion_generate

BOOLEAN = "not ( True ) and ( True ) is"
WEB = (
    "Question: Sherrie tells the truth. Vernell says Sherrie tells the truth. Alexis says Vernell lies. "
    "Michaela says Alexis tells the truth. Elanor says Michaela tells the truth. Does Elanor tell the truth?"
)


@pytest.fixture(scope="module")
def tiny_bd():
    return caidllm.load("tiny-bd", device="cpu")


def test_tiny_bd_loads_by_name_as_a_block_causal_llada_model(tiny_bd):
    assert tiny_bd.config.family == "llada" and tiny_bd.config.block_causal
    assert tiny_bd.config.block_lengths == (4, 8, 16, 32)
    assert tiny_bd.path.name == "tiny-bd"
    assert len(tiny_bd.tokenizer) == len(caidllm.load("tiny").tokenizer)


def test_tiny_bd_decodes_through_the_ordinary_path(tiny_bd):
    """generate() at one of its block lengths: the worked answer starts by restating the input.
    (The engine's block-diffusion layout and cache are the engine's to test; the answers'
    accuracy is the plain decoder's test below and the card's figures.)"""
    (boolean,) = tiny_bd.generate([BOOLEAN], method="vanilla", gen_length=64, block_length=8)
    assert boolean.text.startswith(BOOLEAN.removesuffix(" is") + "\n= ")


@pytest.mark.parametrize("block_length", [8, 32])
def test_tiny_bd_answers_with_the_plain_block_decoder(tiny_bd, block_length):
    boolean, web = block_diffusion_generate(tiny_bd, [BOOLEAN, WEB], block_length, gen_length=128)
    assert score("boolean_expressions", boolean, "False") and score("web_of_lies", web, "No")
