"""A plain re-statement of Elastic-Cache's official loop (VILA-Lab/Elastic-Cache, read in its public copy
yxu-dev/Elastic-Cache at commit 46c0bc3: llada/generate.py `generate_with_elastic_cache` with
block_caching=True and the threshold rule, llada/model/modeling_llada.py `LLaDABlock.attention`), on a
caidllm LLaDA module's weights: per layer caches of the input hidden states, queries, keys and values;
no engine, no batching, batch size 1, no padding.

Switches (caidllm's deviations, each off = as shipped):
- ``end_tokens``: the official stops at one end token id (LLaDA's 126081); caidllm stops at any of the
  model's end tokens (pass their set to compare with the engine).
- ``scope_block``: caidllm's block-wise reading (`elastic-block`): the window slides inside each block of
  `block` positions and each block starts with a forward of every column; no cut at the end token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from caidllm.models.layers import apply_rope, rope_cos_sin, swiglu


class LayerCache:
    def __init__(self):
        self.x = self.q = self.k = self.v = None
        self.track = None


def _attention(q, k):
    """softmax(q k^T / sqrt(hd)) as the official's own scaled_dot_product_attention (need_weights)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


def _layer(block, i, cache, x, rope, positions, state):
    """LLaDABlock.attention + the feed-forward of one layer, as the official modeling file runs it."""
    query_position, track_position, query_masked_position, masked_position = positions
    start_reset, gamma, track_num = state["start_reset"], state["gamma"], state["track_num"]
    if i > start_reset:
        cache.x = x
    else:
        cache.x[:, query_position] = x
        if i == start_reset:
            x = cache.x
    B, T, _ = x.shape
    h = block.attn_norm(x)
    q = block.q_proj(h).view(B, T, -1, block.head_dim).transpose(1, 2)
    k = block.k_proj(h).view(B, T, -1, block.head_dim).transpose(1, 2)
    v = block.v_proj(h).view(B, T, -1, block.head_dim).transpose(1, 2)
    cos, sin = rope["query"] if T != rope["length"] else rope["all"]
    q, k = apply_rope(q, cos, sin, True), apply_rope(k, cos, sin, True)
    if i >= start_reset:  # cache update
        cache.q, cache.k, cache.v = q, k, v
    else:  # cache reuse
        past_k = cache.k.clone()
        cache.k[:, :, query_position] = k
        cache.v[:, :, query_position] = v
        past_q = cache.q[:, :, track_position].clone()
        cache.q[:, :, query_position] = q
        k, v = cache.k, cache.v
    weight = _attention(q, k)
    att = (weight @ v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)).transpose(1, 2).reshape(B, T, -1)
    if i >= start_reset:
        masked_weight = weight[:, :, query_masked_position]
    else:
        masked_weight = weight[:, :, -len(query_masked_position) :]
        now = weight[:, :, : len(track_position)]
        before = _attention(past_q, past_k)
        if float(F.cosine_similarity(before, now, dim=1).mean()) < gamma and i >= state["test_from"]:
            state["start_reset"] = i + 1
    masked_weight = masked_weight.sum(dim=(0, 1, 2))
    masked_weight[masked_position] = 0.0
    cache.track = masked_weight.topk(k=track_num).indices
    x = x + block.attn_out(att)
    return x + swiglu(block.ff_norm(x), block.ff_proj, block.up_proj, block.ff_out)


def _model(lm, caches, ids, positions, state, length):
    t = lm.model.model.transformer
    all_positions = torch.arange(length)[None]
    rope = {
        "length": length,
        "all": rope_cos_sin(all_positions, lm.config.rotary_dim, lm.config.rope_theta),
        "query": rope_cos_sin(positions[0][None], lm.config.rotary_dim, lm.config.rope_theta),
    }
    x = t.wte(ids)
    for i, block in enumerate(t.blocks):
        x = _layer(block, i, caches[i], x, rope, positions, state)
    head = t.wte.weight if lm.config.tie_embeddings else t.ff_out.weight
    return F.linear(t.ln_f(x), head).float()


def _decode_confident(logits, query_masked_position, x, threshold, end_tokens):
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p, x0 = torch.max(p, dim=-1)
    keep = x0_p[0] >= min(threshold, float(x0_p.max()))
    decoded = query_masked_position[keep]
    x[0, decoded] = x0[0, keep]
    ends = torch.tensor([int(token) in end_tokens for token in x0[0, keep]], dtype=torch.bool)
    return decoded, decoded[ends]


@torch.no_grad()
def official_elastic(
    lm,
    prompt,
    gen_length,
    window_length=16,
    threshold=0.9,
    gamma=0.9,
    track_num=1,
    end_tokens=None,
    scope_block=None,
    test_from=0,
):
    """Returns (generated tokens with masks where nothing was decoded, forwards run, refresh layers per
    step)."""
    end_tokens = {lm.config.eos_id} if end_tokens is None else set(end_tokens)
    n_layers = lm.config.n_layers
    caches = [LayerCache() for _ in range(n_layers)]
    P = len(prompt)
    L = P + gen_length
    x = torch.full((1, L), lm.config.mask_id, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    everything = torch.arange(L)
    track_position = everything[:0].clone()
    new_decoded_position = everything[:P].clone()
    masked_position = everything[P:].clone()
    decoded_eos, nfe, refreshes, block = False, 0, [], -1
    while True:
        if scope_block:  # caidllm's reading: the window inside the current block
            current = int(masked_position[0] - P) // scope_block
            scope = masked_position[masked_position < P + (current + 1) * scope_block]
        else:
            current, scope = 0, masked_position
        query_masked_position = scope[:window_length]
        if current != block:  # the first forward (of each block, block-wise): every column
            block, query_position, start_reset = current, everything, -1
            track_position = everything[:0].clone()
        else:
            query_position = torch.cat([track_position, new_decoded_position, query_masked_position])
            start_reset = n_layers
        state = dict(start_reset=start_reset, gamma=gamma, track_num=track_num, test_from=test_from)
        positions = [query_position, track_position, query_masked_position, masked_position]
        logits = _model(lm, caches, x[:, query_position], positions, state, L)
        if logits.shape[1] == L:
            logits = logits[:, query_masked_position]
        else:
            logits = logits[:, -len(query_masked_position) :]
        refreshes.append(state["start_reset"])
        track_position = torch.cat([c.track for c in caches]).unique(sorted=False)
        new_decoded_position, eos_pos = _decode_confident(
            logits, query_masked_position, x, threshold, end_tokens
        )
        masked_position = masked_position[~torch.isin(masked_position, new_decoded_position)]
        nfe += 1
        if not decoded_eos and len(eos_pos) and not scope_block:
            decoded_eos = True
            masked_position = masked_position[masked_position <= int(eos_pos.min())]
        if len(masked_position) == 0:
            break
    return x[0, P:].tolist(), nfe, refreshes


def answer(tokens, end_tokens):
    """The tokens up to and including the first end token (the engine shows the rest as end tokens)."""
    for i, token in enumerate(tokens):
        if token in end_tokens:
            return tokens[: i + 1]
    return tokens
