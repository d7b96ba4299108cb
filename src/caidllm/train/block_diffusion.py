"""The block-diffusion objective (as in BD3-LM, SDAR, LLaDA2): block-causal attention.

A sequence is cut into blocks of `block_length` positions counted from its
first token (the prompt included, as the block decoders lay out the canvas).
Each block of the answer is noised on its own: a mask ratio t_b ~ U(eps, 1)
per block, each answer position of the block masked with probability t_b.
The model reads the noisy copy and the clean copy side by side (2L tokens,
the same RoPE positions for both):

* noisy block b sees noisy block b and the clean blocks before b;
* clean block b sees the clean blocks up to b, never a noisy one.

So one forward trains every block as the block decoder will meet it: its
own masks, every earlier block finished and clean, nothing after it. The
loss is the SFT loss of trainer.py: cross-entropy on the masked noisy
positions weighted by 1/t_b, normalised by the answer length.
"""

from __future__ import annotations

import torch

from caidllm.models.layers import Context
from caidllm.train.data import Batch, masked_loss


def training_mask(blocks: torch.Tensor) -> torch.Tensor:
    """[R, 2L, 2L] bool attention of the noisy copy (first L) and the clean copy (last L)
    of sequences whose positions fall in `blocks` [R, L]."""
    same = blocks[:, :, None] == blocks[:, None, :]
    earlier = blocks[:, None, :] < blocks[:, :, None]
    noisy_row = torch.cat([same, earlier], dim=2)
    clean_row = torch.cat([torch.zeros_like(same), same | earlier], dim=2)
    return torch.cat([noisy_row, clean_row], dim=1)


def noise_blocks(
    batch: Batch, block_length: int, mask_id: int, generator: torch.Generator, eps: float = 1e-3
):
    """Mask the answer positions of each block with its own ratio t_b ~ U(eps, 1).
    Returns the noisy ids, the mask, the masking probability per position and the answer region."""
    ids = batch.input_ids
    B, L = ids.shape
    positions = torch.arange(L)[None, :]
    blocks = positions.expand(B, L) // block_length
    n_blocks = -(-L // block_length)
    t = torch.rand(B, n_blocks, generator=generator)
    p_mask = ((1 - eps) * t + eps).gather(1, blocks)
    in_answer = positions >= batch.answer_start[:, None]
    masked = (torch.rand(B, L, generator=generator) < p_mask) & in_answer
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask, in_answer


def block_diffusion_logits(
    model, noisy: torch.Tensor, clean: torch.Tensor, block_length: int
) -> torch.Tensor:
    """Logits [B, L, V] of the noisy copy, read beside the clean copy (module docstring)."""
    B, L = noisy.shape
    positions = torch.arange(L, device=noisy.device).expand(B, L)
    ctx = Context.explicit(
        torch.cat([positions, positions], dim=1),
        training_mask(positions // block_length),
        model.cfg.rotary_dim,
        model.cfg.rope_theta,
    )
    ctx.targets = positions  # the head runs on the noisy copy only
    return model(torch.cat([noisy, clean], dim=1), ctx)


def block_diffusion_loss(
    model, batch: Batch, block_length: int, mask_id: int, generator: torch.Generator, autocast: bool
) -> torch.Tensor:
    noisy, masked, p_mask, in_answer = noise_blocks(batch, block_length, mask_id, generator)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = block_diffusion_logits(model, noisy, batch.input_ids, block_length)
    return masked_loss(logits, batch.input_ids, masked, p_mask, in_answer)
