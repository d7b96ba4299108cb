"""DiffusionGemma through caidllm's public generate(): its decoders by name, and bad input refused with one
line naming the field (a mask-based decoder or setting, a canvas length the checkpoint does not allow, an
entropy bound <= 0, a seed that is not an integer, image tokens)."""

import pytest

pytest.importorskip("transformers.models.diffusion_gemma")

from caidllm.errors import InputError
from helpers.checkpoints import write_tokenizer
from helpers.dg_reference import reference


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


@pytest.mark.parametrize(
    "kwargs,field",
    [
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
    ],
)
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


def test_the_checkpoints_generation_config_sets_the_defaults(tmp_path):
    """A folder's generation_config.json (the reference's layout: the entropy bound inside sampler_config)
    gives the sampler's defaults; a keyword given wins; absent (null) fields keep the released defaults."""
    import json

    from caidllm.decode.diffusiongemma_settings import (
        GENERATION_DEFAULTS,
        build_settings,
    )

    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "max_denoising_steps": 20,
                "t_max": 1.2,
                "stability_threshold": None,
                "sampler_config": {"entropy_bound": 0.3, "_cls_name": "EntropyBoundSamplerConfig"},
            }
        )
    )
    s = build_settings("diffusiongemma", tmp_path)
    assert (s.max_denoising_steps, s.t_max, s.entropy_bound) == (20, 1.2, 0.3)
    assert s.stability_threshold == GENERATION_DEFAULTS["stability_threshold"]
    assert build_settings("diffusiongemma", tmp_path, entropy_bound=0.05).entropy_bound == 0.05


def test_streamed_canvases_and_chunking(dg_lm):
    """Each finished canvas is one event with its positions and tokens (what a stream shows), the last event
    has the result; the sampling chunk changes no token (the draws equal one whole-canvas multinomial's)."""
    from caidllm.decode.diffusiongemma_settings import build_settings
    from caidllm.decode.uniform_engine import UniformEngine

    tokens = {}
    for chunk in (1, 3, 64):
        engine = UniformEngine(dg_lm)
        engine.submit(
            [5, 9, 3],
            build_settings(
                "diffusiongemma",
                gen_length=24,
                seed=4,
                max_denoising_steps=3,
                sample_chunk=chunk,
                adaptive_stop=False,
            ),
        )
        events = list(engine.run())
        canvases = [e for e in events if e.positions]
        assert [e.positions[0] for e in canvases] == [8 * i for i in range(len(canvases))]
        assert (
            events[-1].finished
            and events[-1].result.token_ids == sum((e.token_ids for e in canvases), [])[:24]
        )
        tokens[chunk] = events[-1].result.token_ids
    assert tokens[1] == tokens[3] == tokens[64]


def test_bfloat16_decodes(dg_lm):
    from caidllm.models import load

    lm = load(dg_lm.path, device="cpu", dtype="bfloat16")
    result = lm.generate([[5, 9, 3]], gen_length=16, seed=0, max_denoising_steps=3)[0]
    assert len(result.token_ids) <= 16 and result.nfe >= 3
