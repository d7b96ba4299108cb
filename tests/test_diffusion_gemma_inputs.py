"""DiffusionGemma through caidllm's public generate(): its decoders by name, and bad input refused with one
line naming the field (a mask-based decoder or setting, a canvas length the checkpoint does not allow, an
entropy bound <= 0, a seed that is not an integer, image tokens)."""

import pytest

pytest.importorskip("transformers.models.diffusion_gemma")

from helpers.checkpoints import write_tokenizer
from helpers.dg_reference import reference

from caidllm.errors import InputError


@pytest.fixture(scope="module")
def dg_lm(tmp_path_factory):
    from caidllm.models import load

    folder = tmp_path_factory.mktemp("dg")
    reference(seed=5, vocab_size=448, canvas_length=8, image_token_id=440).save_pretrained(folder)
    write_tokenizer(folder, "llada", 512)
    return load(folder, device="cpu", dtype="float32")


def test_generate_runs_both_decoders(dg_lm):
    prompt = [[5, 9, 200, 3]]
    sampled = dg_lm.generate(prompt, method="diffusiongemma", gen_length=16, seed=1, max_denoising_steps=4)[0]
    again = dg_lm.generate(prompt, method="diffusiongemma", gen_length=16, seed=1, max_denoising_steps=4)[0]
    greedy = dg_lm.generate(prompt, method="greedy", gen_length=16, max_denoising_steps=4)[0]
    assert sampled.token_ids == again.token_ids and sampled.method == "diffusiongemma"
    assert greedy.method == "greedy" and len(greedy.token_ids) <= 16 and sampled.nfe >= 4
    default = dg_lm.generate(prompt, gen_length=8, seed=1, max_denoising_steps=2)[0]
    assert default.method == "diffusiongemma"


@pytest.mark.parametrize("kwargs,field", [
    ({"method": "cai"}, "'cai'"),
    ({"method": "diffusiongemma", "threshold": 0.9}, "'threshold'"),
    ({"method": "diffusiongemma", "block_length": 32}, "'block_length'"),
    ({"canvas_length": 16}, "canvas_length"),
    ({"entropy_bound": 0}, "entropy_bound"),
    ({"entropy_bound": -1.0}, "entropy_bound"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"t_min": 0.9, "t_max": 0.5}, "t_max"),
    ({"max_denoising_steps": 0}, "max_denoising_steps"),
    ({"stability_threshold": -1}, "stability_threshold"),
    ({"frobnicate": 3}, "'frobnicate'"),
])
def test_bad_settings_are_refused_naming_the_field(dg_lm, kwargs, field):
    with pytest.raises(InputError) as e:
        dg_lm.generate([[5, 9, 3]], gen_length=8, **kwargs)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_image_tokens_and_the_mask_engine_are_refused(dg_lm):
    from caidllm.decode.engine import Engine
    from caidllm.decode.presets import build_config

    with pytest.raises(InputError, match="vision tower"):
        dg_lm.generate([[5, 440, 3]], gen_length=8)
    with pytest.raises(InputError, match="uniform-state"):
        Engine(dg_lm).submit([5, 9, 3], build_config("cai", gen_length=8, block_length=8))
