"""The uniform-state training objective of DiffusionGemma-style models (models/diffusion_gemma.py), as NeMo
AutoModel's DiffusionGemma fine-tuning guide describes the released model's: a corruption level
t ~ U(eps, 1) per example; each canvas position independently replaced by a uniformly random vocabulary
token with probability t (no mask token); the decoder, reading the causal encoder's cache of the clean
prompt, predicts the clean token at every canvas position (cross-entropy); self-conditioning mixed in per
example: with probability `self_conditioning`, a first decoder pass without it (no gradient) gives the soft
embeddings the second pass conditions on, else the second pass gets none (as at a first sampling step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from caidllm.models.diffusion_gemma_cache import DecoderView, DGCache


def corrupt(canvas: torch.Tensor, vocab_size: int, generator: torch.Generator, eps: float = 1e-3):
    """(noisy canvas [B, L], corruption level t [B]): each position uniformly random with probability t."""
    b, n = canvas.shape
    t = eps + (1 - eps) * torch.rand(b, generator=generator, device=canvas.device)
    noise = torch.randint(0, vocab_size, (b, n), generator=generator, device=canvas.device)
    replaced = torch.rand(b, n, generator=generator, device=canvas.device) < t[:, None]
    return torch.where(replaced, noise, canvas), t


def uniform_state_loss(
    model,
    prompts: list[torch.Tensor],
    canvases: torch.Tensor,
    generator: torch.Generator,
    self_conditioning: float = 0.5,
    eps: float = 1e-3,
) -> torch.Tensor:
    """Mean cross-entropy of the clean canvases [B, L] given their prompts (1-d token tensors) and a
    corrupted copy; differentiable through the encoder and the decoder."""
    caches = []
    for prompt in prompts:
        cache = DGCache.empty(model.config.n_layers)
        model.encode(prompt[None], cache)
        caches.append(cache)
    view = DecoderView.batch(caches)
    noisy, _ = corrupt(canvases, model.config.vocab_size, generator, eps)
    soft = None
    use = torch.rand(len(prompts), generator=generator, device=canvases.device) < self_conditioning
    if bool(use.any()):
        with torch.no_grad():
            first = model.denoise(noisy, view, None)
            soft = model.soft_embeddings(first) * use[:, None, None].to(first.dtype)
    logits = model.denoise(noisy, view, soft)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), canvases.reshape(-1))
