"""The shipped DiffusionGemma-architecture model tiny-dg (src/caidllm/assets/tiny-dg, MODEL_CARD.md): it
loads by name through the diffusion_gemma family (sliding and full layers, routed experts, soft-capping,
canvases of 64), generates recorded tokens with the uniform-state decoders, answers a BBH-style question
from the command line, and a seeded request's tokens do not depend on its batch."""

import json
import re

import pytest

import caidllm
from caidllm.cli import main
from caidllm.models.diffusion_gemma import DiffusionGemmaModel
from caidllm.models.diffusion_gemma_config import FULL, SLIDING

BOOLEAN = "not ( True ) and ( True ) is"
MORE = ["True and not not ( not False ) is", "not True or ( False and True ) is"]


@pytest.fixture(scope="module")
def tiny_dg():
    return caidllm.load("tiny-dg", device="cpu")


def test_tiny_dg_loads_through_the_diffusion_gemma_family(tiny_dg):
    c, shape = tiny_dg.config, tiny_dg.model.shape
    assert c.family == "diffusion_gemma" and isinstance(tiny_dg.model, DiffusionGemmaModel)
    assert tiny_dg.path.name == "tiny-dg" and (c.hidden_size, c.n_layers, c.vocab_size) == (256, 6, 640)
    assert shape.layer_types == (SLIDING, SLIDING, FULL) * 2 and shape.softcap == 30.0
    assert shape.canvas_length == 64 and (c.moe.num_experts, c.moe.num_experts_per_tok) == (4, 2)


@pytest.mark.parametrize("method", ["greedy", "diffusiongemma"])
def test_tiny_dg_generates_these_tokens(tiny_dg, method):
    """Seeded: the exact tokens recorded from the shipped weights; a worked chain ending in an answer, the
    right one for greedy (the sampled chain at seed 0 slips, below)."""
    (result,) = tiny_dg.generate([BOOLEAN], method=method, gen_length=64, seed=0)
    assert result.token_ids[: result.answer_length] == EXPECTED_TOKENS[method]
    assert result.nfe == EXPECTED_FORWARDS[method]
    assert result.text.rstrip().endswith(EXPECTED_ANSWER[method])


def test_a_seeded_request_is_the_same_alone_and_batched(tiny_dg):
    alone = [tiny_dg.generate([p], method="diffusiongemma", gen_length=64, seed=3)[0] for p in MORE]
    batched = tiny_dg.generate(MORE, method="diffusiongemma", gen_length=64, seed=3, batch_size=2)
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]


def test_the_command_line_answers_out_of_the_box(capsys):
    # seeded: without a seed the sampler draws a fresh generator; the default decoder samples, so its
    # chain ends in an answer (right about 4 times in 5), and greedy's is the right one here
    assert main(["generate", "--model", "tiny-dg", "--seed", "0", "--json", BOOLEAN]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["method"] == "diffusiongemma"
    assert re.search(r"So the answer is (True|False)\.$", out["text"].rstrip())
    assert (
        main(["generate", "--model", "tiny-dg", "--method", "greedy", "--seed", "0", "--json", BOOLEAN]) == 0
    )
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["text"].rstrip().endswith("So the answer is False.")


# Recorded from the shipped weights (step 900, seed 0). greedy, right in 21 forwards (its third line is
# garbled but the chain recovers):
# not ( True ) and ( True )\n= not True and ( True )\n= not and not True\n= False and True\n= False\n
# So the answer is False.
# diffusiongemma, in 18 forwards, slips at its fourth line ("= True and True") and answers True: the
# model is right about 77-81% of the time on the real questions (MODEL_CARD.md), so a seeded sample can be
# wrong; greedy pins the right answer.
# not ( True ) and ( True )\n= not True and ( True )\n= not and not True\n= True and True\n= True\n
# So the answer is True.
EXPECTED_TOKENS = {
    "greedy": [
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
        376,
        455,
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
        499,
        377,
        444,
        298,
        19,
    ],
    "diffusiongemma": [
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
        376,
        455,
        361,
        204,
        34,
        361,
        376,
        361,
        204,
        34,
        361,
        204,
        553,
        499,
        377,
        444,
        361,
        19,
    ],
}
EXPECTED_FORWARDS = {"greedy": 21, "diffusiongemma": 18}
EXPECTED_ANSWER = {"greedy": "So the answer is False.", "diffusiongemma": "So the answer is True."}
