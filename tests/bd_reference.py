"""Plain re-statements of the official block-diffusion generators, for parity tests.

Each recomputes the whole window (every block up to the current one) at every step, through
the model's block-causal forward (the official block-diagonal-causal attention mask), with no
cache. Greedy reading: the predicted token is the argmax and its confidence its softmax
probability (the official samplers draw from the softmax; at temperature 0 the argmax is what
LLaDA2's and SDAR's documentation call greedy decoding), the mask token never predicted.

- ``llada2_generate``: inclusionAI's LLaDA2.x `generate` (threshold decoding, eos_early_stop).
- ``sdar_generate``: JetAstra SDAR's `block_diffusion_generate` (low_confidence_dynamic / _static).
- ``llada21_generate``: inclusionAI's LLaDA2.1 `generate` (threshold decoding with token editing).
- ``stable_diffcoder_generate``: ByteDance Seed's Stable-DiffCoder `generate_block` (low_confidence with a
  fixed quota per step, threshold None): its canvas ends at prompt + gen_length, so when the prompt does not
  fill whole blocks its first and last blocks are partial (caidllm lays masks to the end of the last block).
All return the generated tokens up to and including the first stop id (or gen_length of them).

Switches for the code as shipped where caidllm deviates (their defaults are caidllm's position; the
engine matches the re-statement there, docs/decoder-fidelity.md):
- llada21_generate(shipped_01_mask=True): the shipped LLaDA2.1 file builds its block mask as 0/1 in the
  model dtype without the log the 2.0 file takes, so attention adds it as a +1/0 bias: not block-causal.
- sdar_generate(capped_topk=False): the shipped `torch.topk(confidence, k)` is not capped at the masks
  left, so a step with fewer masks than its quota rewrites committed (or prompt) positions.
- sdar_generate(top_k_one=True): SDAR's own greedy setting (`top_k=1`): the sampled token's probability
  after the top-k filter is 1.0 everywhere, so every confidence passes any threshold below 1.
"""

from __future__ import annotations

import torch

from caidllm.models.modes import Full


def transfer_schedule(block_length: int, steps: int) -> list[int]:
    return [block_length // steps + (i < block_length % steps) for i in range(steps)]


def _additive_01_forward(lm, ids, block_length):
    """The window's logits with the shipped LLaDA2.1 mask: 1.0 where the block-causal mask allows, 0.0
    elsewhere, added to the attention scores."""
    n = ids.shape[1]
    blocks = torch.arange(n) // block_length
    bias = (blocks[None, :] <= blocks[:, None]).float()[None, None]  # [1, 1, n, n]
    positions = torch.arange(n)[None]
    return lm.forward_with_attention(ids, positions, bias, positions)


def _greedy(lm, x, window_end, block_length, shipped_01_mask=False, top_k_one=False):
    if shipped_01_mask:
        logits = _additive_01_forward(lm, x[None, :window_end], block_length)[0, -block_length:]
    else:
        logits = lm.forward(x[None, :window_end], mode=Full(attention_block=block_length))[0, -block_length:]
    logits[:, lm.config.mask_id] = -torch.inf  # as the engine: the mask token is never a prediction
    probs = logits.double().softmax(-1)
    x0 = probs.argmax(-1)
    if top_k_one:  # top_k=1 keeps one token: its probability after the filter is 1
        return x0, torch.ones(x0.shape, dtype=probs.dtype)
    return x0, probs.gather(-1, x0[:, None])[:, 0]


def _canvas(prompt, gen_length, block_length, mask_id):
    """The official layout: blocks from position 0, masks to the end of the last block."""
    P = len(prompt)
    num_blocks = (P + gen_length + block_length - 1) // block_length
    x = torch.full((num_blocks * block_length,), mask_id, dtype=torch.long)
    x[:P] = torch.tensor(prompt)
    return P, num_blocks, x


def _answer(x, prompt_length, gen_length, stop_ids):
    out = x[prompt_length : prompt_length + gen_length].tolist()
    for i, t in enumerate(out):
        if t in stop_ids:
            return out[: i + 1]
    return out


def llada2_generate(
    lm,
    prompt,
    *,
    gen_length,
    block_length,
    steps,
    threshold,
    minimal_topk=1,
    eos_early_stop=True,
    stop_ids=(),
):
    mask_id = lm.config.mask_id
    steps = min(steps, gen_length // minimal_topk)
    P, num_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
    schedule = transfer_schedule(block_length, steps)
    for block in range(P // block_length, num_blocks):
        end = (block + 1) * block_length
        for step in range(steps):
            active = x[end - block_length : end] == mask_id
            if not active.any():
                break
            x0, p = _greedy(lm, x, end, block_length)
            confidence = torch.where(active, p, torch.tensor(-torch.inf, dtype=p.dtype))
            high = confidence > threshold
            if int(high.sum()) >= schedule[step]:
                transfer = high
            else:
                transfer = torch.zeros_like(active)
                transfer[torch.topk(confidence, min(schedule[step], int(active.sum()))).indices] = True
            x[end - block_length : end][transfer] = x0[transfer]
            if eos_early_stop and any(int(t) in stop_ids for t in x0[transfer]):
                generated = x[P:end].tolist()
                first = next((i for i, t in enumerate(generated) if t in stop_ids), None)
                if first is not None and mask_id not in generated[:first]:
                    return _answer(x, P, gen_length, stop_ids)
        if any(int(t) in stop_ids for t in x[P:end]):
            break
    return _answer(x, P, gen_length, stop_ids)


def sdar_generate(
    lm,
    prompt,
    *,
    gen_length,
    block_length,
    denoising_steps,
    strategy,
    threshold=0.9,
    stop_ids=(),
    capped_topk=True,
    top_k_one=False,
):
    """Official SDAR loop (switches: the module docstring)."""
    mask_id = lm.config.mask_id
    P, num_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
    schedule = transfer_schedule(block_length, denoising_steps)
    for block in range(P // block_length, num_blocks):
        end = (block + 1) * block_length
        for step in range(denoising_steps):
            masked = x[end - block_length : end] == mask_id
            if not masked.any():
                break
            x0, p = _greedy(lm, x, end, block_length, top_k_one=top_k_one)
            confidence = torch.where(masked, p, torch.tensor(-torch.inf, dtype=p.dtype))
            k = min(schedule[step], int(masked.sum())) if capped_topk else schedule[step]
            transfer = torch.zeros_like(masked)
            if strategy == "low_confidence_dynamic" and int((confidence > threshold).sum()) >= schedule[step]:
                transfer = confidence > threshold
            else:
                transfer[torch.topk(confidence, k).indices] = True
            x[end - block_length : end][transfer] = x0[transfer]
        if any(int(t) in stop_ids for t in x[P:end]):
            break
    return _answer(x, P, gen_length, stop_ids)


def llada21_generate(
    lm,
    prompt,
    *,
    gen_length,
    block_length,
    threshold,
    editing_threshold,
    max_post_steps,
    num_to_transfer=1,
    eos_early_stop=True,
    stop_ids=(),
    shipped_01_mask=False,
):
    """inclusionAI's LLaDA2.1 `generate`: threshold decoding with a fixed quota (num_to_transfer) and
    token editing of the current block's committed, non-prompt positions; up to max_post_steps
    editing steps once the block has no mask; stop after a block when the answer has an end token."""
    mask_id = lm.config.mask_id
    P, num_blocks, x = _canvas(prompt, gen_length, block_length, mask_id)
    for block in range(P // block_length, num_blocks):
        start, end = block * block_length, (block + 1) * block_length
        prompt_in_block = torch.arange(start, end) < P
        post_steps = 0
        while True:
            old = x[start:end].clone()
            active = old == mask_id
            if not active.any():
                post_steps += 1
            if post_steps > max_post_steps:
                break
            x0, p = _greedy(lm, x, end, block_length, shipped_01_mask=shipped_01_mask)
            transfer = torch.zeros_like(active)
            if active.any():
                confidence = torch.where(active, p, torch.tensor(-torch.inf, dtype=p.dtype))
                high = confidence > threshold
                if int(high.sum()) >= num_to_transfer:
                    transfer = high
                else:
                    transfer[torch.topk(confidence, min(num_to_transfer, int(active.sum()))).indices] = True
            editable = ~active & ~prompt_in_block
            edit = editable & (p > editing_threshold) & (x0 != old)
            x[start:end][transfer | edit] = x0[transfer | edit]
            if not active.any() and not edit.any():
                break
        generated = x[P:end].tolist()
        if eos_early_stop and mask_id not in generated and any(t in stop_ids for t in generated):
            break
    return _answer(x, P, gen_length, stop_ids)


def stable_diffcoder_generate(lm, prompt, *, gen_length, block_length, steps, stop_ids=()):
    """Stable-DiffCoder's loop: steps // (gen_length // block_length) steps for every block (the partial
    ones too), each block's quota spread over them from its own mask count, the quota's most confident
    masked positions committed; it stops after a completed block that holds an end token."""
    mask_id, P = lm.config.mask_id, len(prompt)
    x = torch.tensor(list(prompt) + [mask_id] * gen_length)
    per_block = steps // (gen_length // block_length)
    sizes = [block_length] * (gen_length // block_length)
    if P % block_length:  # the prompt's last block is completed first; the answer's last block is cut short
        sizes = [block_length - P % block_length, *sizes[:-1], P % block_length]
    start, end = P - P % block_length, P
    for size in sizes:
        end += size
        for quota in transfer_schedule(int((x[start:end] == mask_id).sum()), per_block):
            if quota:
                x0, p = _greedy(lm, x, end, block_length)
                x0, p = x0[-(end - start) :], p[-(end - start) :]
                masked = x[start:end] == mask_id
                confidence = torch.where(masked, p, torch.tensor(-torch.inf, dtype=p.dtype))
                pick = torch.topk(confidence, quota).indices
                x[start:end][pick] = x0[pick]
        if any(int(t) in stop_ids for t in x[P:end]):
            break
        start = end
    return _answer(x, P, gen_length, stop_ids)
