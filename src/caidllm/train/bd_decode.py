"""A plain block-diffusion decoder for validating and evaluating block-causal training
(the engine's own block decoding is decode/; this one needs nothing from it).

Vanilla low-confidence remasking per block: blocks of `block_length` counted from
each prompt's first token (the block holding the prompt's end is part prompt, part
masks); each step forwards the current block against the cached keys and values of
the finished ones and commits the masked position the model is surest of; when a
block is complete its final keys and values are written once. Block-causal
attention makes that cache exact. A row stops after the block in which it wrote
an end-of-answer token.
"""

from __future__ import annotations

import torch

from caidllm.models.layers import Context


@torch.no_grad()
def block_diffusion_generate(
    lm, prompts: list[str], block_length: int, gen_length: int = 256, batch_size: int = 16
) -> list[str]:
    """Answers to `prompts` (chat template applied), decoded with one token per step."""
    texts = []
    for first in range(0, len(prompts), batch_size):
        texts += _generate_batch(
            lm, [lm.encode_chat(p) for p in prompts[first : first + batch_size]], block_length, gen_length
        )
    return texts


def _generate_batch(lm, prompts: list[list[int]], block_length: int, gen_length: int) -> list[str]:
    model, config, bl = lm.model, lm.config, block_length
    ids, real, starts = _canvas(prompts, bl, gen_length, config.eos_id, config.mask_id)
    B, L = ids.shape
    positions = (real.long().cumsum(1) - 1).clamp(min=0)
    ids, real, positions = ids.to(lm.device), real.to(lm.device), positions.to(lm.device)
    cache = lm.new_cache(B, L)

    # The model layer's block-causal attention (blocks from each row's first real token), as
    # the engine runs it; the key mask hides the padding.
    model(
        ids,
        Context.build(real, positions, config.rotary_dim, config.rope_theta, cache=cache, attention_block=bl),
    )

    eos = torch.tensor(config.eos_ids, device=lm.device)
    done = torch.zeros(B, dtype=torch.bool, device=lm.device)
    first_block = min(starts) // bl
    for block in range(first_block, L // bl):
        block_starts = torch.full((B,), block * bl, device=lm.device)

        def forward():
            # the block, against the cache
            columns = block_starts[:, None] + torch.arange(bl, device=lm.device)
            ctx = Context.build(
                real,
                positions,
                config.rotary_dim,
                config.rope_theta,
                index=columns,
                targets=columns,
                cache=cache,
                attention_block=bl,
            )
            return model(ids[:, block * bl : (block + 1) * bl], ctx)

        for _ in range(bl):
            masked = (ids[:, block * bl : (block + 1) * bl] == config.mask_id) & ~done[:, None]
            if not bool(masked.any()):
                break
            _commit_surest(ids[:, block * bl : (block + 1) * bl], masked, forward())
        for r, start in enumerate(starts):
            answer = ids[r, start : (block + 1) * bl]
            done[r] |= bool(torch.isin(answer, eos).any())
        if bool(done.all()):
            break
        forward()  # the finished block's final keys and values, read by every later block
    return _texts(lm, ids, starts, gen_length)


def _canvas(prompts: list[list[int]], bl: int, gen_length: int, eos_id: int, mask_id: int):
    """[B, L] ids (prompts left-padded by whole blocks, so every row's blocks share the same columns; then
    gen_length masks), which of them are real (not padding), and each row's first answer column."""
    longest = max(len(p) for p in prompts)
    padding = [bl * ((longest - len(p)) // bl) for p in prompts]
    starts = [pad + len(p) for pad, p in zip(padding, prompts)]
    L = -(-(longest + gen_length) // bl) * bl
    ids = torch.full((len(prompts), L), eos_id, dtype=torch.long)
    real = torch.zeros(len(prompts), L, dtype=torch.bool)
    for r, (pad, prompt, start) in enumerate(zip(padding, prompts, starts)):
        ids[r, pad:start] = torch.tensor(prompt)
        ids[r, start : start + gen_length] = mask_id
        real[r, pad : start + gen_length] = True
    return ids, real, starts


def _commit_surest(block_ids: torch.Tensor, masked: torch.Tensor, logits: torch.Tensor) -> None:
    """Commit, in place, each row's masked position the model is surest of (rows with none left unchanged)."""
    confidence, predicted = logits.softmax(-1).max(-1)
    confidence = torch.where(masked, confidence, torch.full_like(confidence, -1.0))
    choice = confidence.argmax(1, keepdim=True)
    rows = masked.any(1)
    chosen = predicted.gather(1, choice)
    block_ids.scatter_(1, choice, torch.where(rows[:, None], chosen, block_ids.gather(1, choice)))


def _texts(lm, ids: torch.Tensor, starts: list[int], gen_length: int) -> list[str]:
    """Each row's answer up to its first end-of-answer (or still masked) token."""
    texts = []
    for r, start in enumerate(starts):
        answer = ids[r, start : start + gen_length].tolist()
        ends = [
            i for i, token in enumerate(answer) if token in lm.config.eos_ids or token == lm.config.mask_id
        ]
        texts.append(lm.decode(answer[: ends[0]] if ends else answer))
    return texts
