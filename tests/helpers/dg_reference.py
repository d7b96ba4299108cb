"""transformers' DiffusionGemma (the oracle, installed with caidllm's test dependencies) on small random
configs, and caidllm's model built from the same config and weights."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from caidllm.models.diffusion_gemma import DiffusionGemmaModel
from caidllm.models.families import parse_config


def text_config(**overrides) -> dict:
    """Four layers (sliding, full, sliding, full), a window of 4 (prompts longer than it exercise it),
    full layers with their own head size and one key/value head, a soft-cap small enough to bite."""
    config = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        global_head_dim=16,
        num_global_key_value_heads=1,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        num_experts=6,
        top_k_experts=2,
        moe_intermediate_size=12,
        max_position_embeddings=512,
        final_logit_softcapping=3.0,
        eos_token_id=1,
        pad_token_id=0,
    )
    config.update(overrides)
    return config


def reference(
    seed: int = 0, canvas_length: int = 8, scale: float = 0.7, image_token_id: int = 258_880, **overrides
):
    """transformers' DiffusionGemmaForBlockDiffusion (fp32, eager attention), every weight redrawn
    (scale / sqrt(fan-in)) large enough that the outputs are far from uniform, small enough that the
    float rounding differences between two implementations do not grow through the self-conditioning
    loop into different samples within a test's steps (a random model with large weights is chaotic)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
    )
    config = DiffusionGemmaConfig(
        text_config=text_config(**overrides),
        vision_config=vision,
        canvas_length=canvas_length,
        image_token_id=image_token_id,
    )
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision" in name:
                continue
            if p.ndim == 1:  # norms, scales: around one
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (scale / p.shape[-1] ** 0.5))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=generator))
    return model


def ours_from(model) -> DiffusionGemmaModel:
    """caidllm's model from the reference's config.json and state dict."""
    return ours_from_saved(saved(model))


def saved(model) -> dict:
    """The reference's config.json dict and state dict (what ours_from_saved needs, without transformers)."""
    raw = model.config.to_dict()
    raw["architectures"] = ["DiffusionGemmaForBlockDiffusion"]
    return {"raw": raw, "state": model.state_dict()}


def ours_from_saved(saved: dict) -> DiffusionGemmaModel:
    ours = DiffusionGemmaModel(parse_config(saved["raw"]))
    ours.load_state_dict(saved["state"])
    return ours.eval()


def engine_lm(model):
    """What UniformEngine needs of a loaded model, around caidllm's copy of `model` (end id 1, pad 0)."""
    return serve_lm(saved(model))


def serve_lm(saved: dict):
    """engine_lm of a saved reference (ours_from_saved)."""
    ours = ours_from_saved(saved)
    config = SimpleNamespace(**{**ours.config.__dict__, "eos_ids": (1,), "pad_id": 0})
    return SimpleNamespace(model=ours, config=config, device=torch.device("cpu"), decode=lambda ids: "")


def run_engine(lm, prompts, seed, gen_length, method="diffusiongemma", exact_seed=True, **knobs) -> list:
    """Every prompt through one UniformEngine (all in one batch); the results in the prompts' order."""
    from caidllm.decode.diffusiongemma_settings import build_settings
    from caidllm.decode.uniform_engine import UniformEngine

    engine = UniformEngine(lm, max_batch=len(prompts))
    ids = [
        engine.submit(
            p, build_settings(method, gen_length=gen_length, seed=seed, exact_seed=exact_seed, **knobs)
        )
        for p in prompts
    ]
    results = {e.request_id: e.result for e in engine.run() if e.finished}
    return [results[i] for i in ids]
