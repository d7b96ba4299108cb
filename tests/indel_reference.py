"""A re-statement of SGLang's JointThresholdInDel (sgl-project/sglang,
python/sglang/srt/dllm/algorithm/joint_threshold_indel.py, PR #31773) for the parity tests: its state dict,
its step on one block (quirks included: the cumulative post-edit budget, the least-confident anti-loop
position, the fallback and scrub argmaxes), and a cacheless batch-1 loop over a block-causal model's whole
window, block after block, as its scheduler drives it (a block ends when its step reports it finished)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def init_state(block: torch.Tensor, mask_id: int) -> dict:
    prompt_len = int((block != mask_id).long().cumprod(0).sum())
    prompt_index = torch.arange(block.numel()) < prompt_len
    return {
        "prompt_len": prompt_len,
        "prompt_index": prompt_index,
        "is_orig_mask": torch.where(prompt_index, False, block == mask_id),
        "post_edit_steps": 0,
        "num_update_steps": 0,
        "finished": False,
        "seen_input_keys": set(),
        "sampled_history": {},
    }


def apply_edit_operations(block_tokens, old_block_tokens, is_orig_mask, prompt_len, ids):
    mask_id, delete_id, split_id = ids
    size = len(block_tokens)
    tokens, flags = old_block_tokens[:prompt_len], is_orig_mask[:prompt_len]
    for i in range(prompt_len, size):
        if block_tokens[i] == delete_id:
            continue
        if block_tokens[i] == split_id:
            tokens = tokens + [mask_id, old_block_tokens[i]]
            flags = flags + [False, is_orig_mask[i]]
        else:
            tokens, flags = tokens + [block_tokens[i]], flags + [is_orig_mask[i]]
    if len(tokens) > size:
        return tokens[:size], flags[:size]
    return tokens + [mask_id] * (size - len(tokens)), flags + [False] * (size - len(tokens))


def step(state, block, logits, ids, threshold=0.5, edit_threshold=0.0, max_post_edit_steps=16):
    """One step of one block: block [B] (changed in place), logits [B, V]. Returns done."""
    mask_id, delete_id, split_id = ids
    size = block.numel()
    if state["finished"]:
        return True
    prompt = state["prompt_index"]
    x = torch.argmax(logits, dim=-1)
    probabilities = F.softmax(logits, dim=-1)
    p = torch.gather(probabilities, -1, x[:, None])[:, 0]
    mask_index = torch.where(prompt, False, block == mask_id)
    original_mask_index = state["is_orig_mask"] & mask_index
    original_count, total_count = int(original_mask_index.sum()), int(mask_index.sum())
    state["num_update_steps"] += 1
    if original_count == 0:
        state["post_edit_steps"] += 1
    final = (
        (max_post_edit_steps > 0 and state["post_edit_steps"] >= max_post_edit_steps)
        or (max_post_edit_steps == 0 and original_count == 0)
        or state["num_update_steps"] > size + max_post_edit_steps
    )
    if not final:
        fallback = (original_mask_index & (x == mask_id)).nonzero().view(-1)
        if fallback.numel():
            alt = logits[fallback].clone()
            alt[:, mask_id] = float("-inf")
            x[fallback] = alt.argmax(dim=-1)
            p[fallback] = probabilities[fallback, x[fallback]]
    transfer = torch.zeros_like(mask_index)
    if total_count > 0:
        confidence = torch.where(mask_index, p, float("-inf"))
        if final:
            transfer = mask_index & ~prompt
        elif original_count > 0:
            required = 1 + total_count - original_count
            high = (confidence > threshold) & mask_index
            if int(high.sum()) >= required:
                transfer = high
            else:
                transfer[torch.topk(confidence, k=min(required, total_count)).indices] = True
        else:
            transfer = mask_index
    if max_post_edit_steps == 0 and original_count > 0 and not bool((original_mask_index & ~transfer).any()):
        final, transfer = True, mask_index & ~prompt
    edit = (p > edit_threshold) & (block != x) & ~mask_index & ~prompt
    write = (transfer | edit).nonzero().view(-1)
    if write.numel() == 0:
        state["finished"] = True
        return True
    if final:
        scrub = write[(x[write] == mask_id) | (x[write] == delete_id) | (x[write] == split_id)]
        if scrub.numel():
            alt = logits[scrub].clone()
            alt[:, [mask_id, delete_id, split_id]] = float("-inf")
            x[scrub] = alt.argmax(dim=-1)
    old = block.tolist()
    if tuple(old) in state["seen_input_keys"] and not final:
        changing = ((transfer | edit) & (x != block)).nonzero().view(-1)
        if changing.numel():
            at = int(changing[p[changing].argmin()])
            scores = logits[at].clone()
            for token in state["sampled_history"].get(at, ()):
                scores[token] = float("-inf")
            if original_mask_index[at]:
                scores[mask_id] = float("-inf")
            x[at] = scores.argmax()
    state["seen_input_keys"].add(tuple(old))
    tokens, indel, changed = list(old), False, False
    for pos, token in zip(write.tolist(), x[write].tolist()):
        state["sampled_history"].setdefault(pos, set()).add(token)
        tokens[pos] = token
        indel |= token in (delete_id, split_id)
        changed |= token != old[pos]
    if indel:
        tokens, flags = apply_edit_operations(
            tokens, old, state["is_orig_mask"].tolist(), state["prompt_len"], ids
        )
        state["is_orig_mask"] = torch.tensor(flags)
    block[:] = torch.tensor(tokens)
    if final:
        state["finished"] = True
        return not changed  # SGLang forwards once more to write the block's cache
    return False


@torch.no_grad()
def generate(lm, prompt: list[int], gen_length: int, block_length: int, **settings):
    """Batch 1, no cache: every step forwards the window up to the block's end. Returns (the generated
    tokens, forwards per block as SGLang counts them)."""
    mask_id = lm.config.mask_id
    ids = (mask_id, *lm.config.edit_tokens)
    end = -(-(len(prompt) + gen_length) // block_length) * block_length
    canvas = torch.tensor(prompt + [mask_id] * (end - len(prompt)))
    forwards = []
    for start in range(len(prompt) // block_length * block_length, end, block_length):
        block = canvas[start : start + block_length]
        state, n = init_state(block, mask_id), 0
        while True:
            logits = lm.model(canvas[None, : start + block_length])[0, start:].float()
            n += 1
            if step(state, block, logits, ids, **settings):
                break
        forwards.append(n)
    return canvas[len(prompt) : len(prompt) + gen_length].tolist(), forwards
