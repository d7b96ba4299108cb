"""The uniform-state decoders against transformers' DiffusionGemma generate() (token-exact at batch 1,
same seed: the same random draws in the same order), and their batch invariance in caidllm's engine."""

import pytest
import torch

pytest.importorskip("transformers.models.diffusion_gemma")

from caidllm.decode.diffusiongemma_settings import build_settings
from caidllm.decode.uniform_engine import UniformEngine
from helpers.dg_reference import engine_lm as _lm
from helpers.dg_reference import reference
from helpers.dg_reference import run_engine as _ours


def _reference_tokens(model, prompt, seed, gen_length, **knobs):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        EntropyBoundSamplerConfig,
    )

    settings = dict(
        max_denoising_steps=knobs.get("max_denoising_steps", 12),
        t_min=knobs.get("t_min", 0.4),
        t_max=knobs.get("t_max", 0.8),
    )
    if knobs.get("adaptive_stop", True):
        settings.update(
            stability_threshold=knobs.get("stability_threshold", 1),
            confidence_threshold=knobs.get("confidence_threshold", 0.005),
        )
    else:
        settings.update(stability_threshold=None, confidence_threshold=None)
    torch.manual_seed(seed)
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=gen_length,
        eos_token_id=1,
        pad_token_id=0,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=knobs.get("entropy_bound", 0.1)),
        **settings,
    )
    return out.sequences[0, len(prompt) :].tolist()


# prompt length, canvases, knobs. A random model's entropies stay high (log 96 = 4.56 at most): a confidence
# threshold above that makes the stable-and-confident stop fire (at once without the stability test).
# The two implementations' float rounding differs by ~1e-6 at a first step; a random model's self-conditioning
# loop grows it (about 3x a step with every position accepted), so the steps stay few enough that it
# never reaches a sample.
CASES = [
    (3, 2, {}),
    (9, 3, {"entropy_bound": 0.5}),
    (6, 2, {"entropy_bound": 2.0, "stability_threshold": 1, "confidence_threshold": 5.0}),
    (12, 2, {"adaptive_stop": False, "max_denoising_steps": 5}),
    (5, 2, {"t_min": 0.1, "t_max": 1.5, "confidence_threshold": 5.0, "stability_threshold": 0}),
    (
        7,
        2,
        {
            "entropy_bound": 8.0,
            "stability_threshold": 2,
            "confidence_threshold": 5.0,
            "max_denoising_steps": 6,
        },
    ),
]


@pytest.mark.parametrize("prompt_len,canvases,knobs", CASES)
def test_generate_matches_transformers_token_for_token(prompt_len, canvases, knobs):
    model = reference(seed=prompt_len, canvas_length=8)
    lm = _lm(model)
    prompt = torch.randint(2, 96, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    for seed in (0, 11):
        knobs = {"max_denoising_steps": 12, **knobs}
        expected = _reference_tokens(model, prompt, seed, 8 * canvases, **knobs)
        [result] = _ours(lm, [prompt], seed, 8 * canvases, **knobs)
        assert result.token_ids == expected[: len(result.token_ids)]
        assert len(result.token_ids) == len(expected)
        if knobs.get("stability_threshold") == 0:  # the adaptive stop fired before the last step
            assert max(result.steps_per_block) < knobs["max_denoising_steps"]


def test_a_seeded_request_is_the_same_alone_batched_and_joining_mid_flight():
    lm = _lm(reference(seed=4, canvas_length=8))
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
    alone = [_ours(lm, [p], 3, 24, exact_seed=False, entropy_bound=0.3)[0].token_ids for p in prompts]
    together = [r.token_ids for r in _ours(lm, prompts, 3, 24, exact_seed=False, entropy_bound=0.3)]
    assert together == alone
    engine = UniformEngine(lm, max_batch=3)
    first = engine.submit(
        prompts[0], build_settings("diffusiongemma", gen_length=24, seed=3, entropy_bound=0.3)
    )
    engine.step(), engine.step()
    late = engine.submit(
        prompts[1], build_settings("diffusiongemma", gen_length=24, seed=3, entropy_bound=0.3)
    )
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    assert results[first].token_ids == alone[0] and results[late].token_ids == alone[1]


def test_greedy_is_reproducible_and_differs_from_sampling():
    lm = _lm(reference(seed=6, canvas_length=8))
    a = _ours(lm, [[3, 4, 5]], None, 16, method="greedy", exact_seed=False)[0].token_ids
    b = _ours(lm, [[3, 4, 5]], None, 16, method="greedy", exact_seed=False)[0].token_ids
    assert a == b


def test_a_step_holds_one_full_size_float32_tensor():
    """The [batch, canvas, vocab] float32 logits are the only allocation of that size in a step (the softmax,
    sampling draws, entropies and self-conditioning probabilities go `sample_chunk` positions at a time)."""
    from torch.profiler import ProfilerActivity, profile

    from caidllm.decode.diffusiongemma_sampler import denoise_step

    lm = _lm(reference(seed=1, canvas_length=64, vocab_size=4096))
    engine = UniformEngine(lm, max_batch=2)
    for p in ([3, 4, 5], [6, 7]):
        engine.submit(p, build_settings("diffusiongemma", gen_length=64, seed=0, sample_chunk=16))
    engine.step()  # admission and a first step (no self-conditioning yet)
    full = 2 * 64 * 4096 * 4
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        denoise_step(lm.model, list(engine.running.values()))
    events = [e for e in prof.events() if e.cpu_memory_usage > 0]
    # the logits' allocation, seen at each level of the head's matmul (linear > matmul > mm), and no other
    big = [e for e in events if e.cpu_memory_usage >= full // 2]
    assert {e.name for e in big} <= {"aten::linear", "aten::matmul", "aten::mm"}
    assert sum(1 for e in big if e.name == "aten::mm") == 1
    assert max(e.cpu_memory_usage for e in events if e not in big) <= full // 8  # a chunk: 16 of 64 positions
