"""A re-statement of Nemotron-Labs-Diffusion's official decoding loops (the hub repository's
``modeling_nemotron_labs_diffusion.py``: ``ar_generate``, ``generate``, ``linear_spec_generate``, called as
``chat_ar.py`` / ``chat_dlm.py`` / ``chat_linear_spec.py`` call them), batch 1, temperature 0, for the
parity tests. The model is transformers' own Ministral3Model (the backbone the hub's modeling_ministral.py
copies) with the caidllm model's weights and head; its KV cache is re-stated as the list of cached token
ids, every forward recomputing them under an explicit attention mask (the same logits a cache gives):
``diffusion_lm = False`` is a causal mask over cache + new tokens, ``diffusion_lm = True`` lets the new
tokens see each other; ``use_cache=True`` appends the new tokens to the cache, ``_crop_dynamic_cache``
truncates it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Ministral3Config
from transformers.models.ministral3.modeling_ministral3 import Ministral3Model


class Reference:
    def __init__(self, lm):
        c, raw = lm.config, lm.config.raw
        config = Ministral3Config(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.n_layers,
            num_attention_heads=c.n_heads,
            num_key_value_heads=c.n_kv_heads,
            head_dim=c.head_dim,
            max_position_embeddings=c.max_length,
            rms_norm_eps=c.rms_norm_eps,
            rope_parameters=dict(raw["rope_parameters"]),
            tie_word_embeddings=False,
        )
        config._attn_implementation = "eager"
        self.encoder = Ministral3Model(config).eval().to(lm.dtype)
        state = {
            k[len("encoder.") :]: v for k, v in lm.model.state_dict().items() if k.startswith("encoder.")
        }
        self.encoder.load_state_dict(state, strict=False)
        self.head = lm.model.diffusion_head
        self.mask_token_id = c.mask_id
        self.cache: list[int] = []  # the DynamicCache, as the token ids whose keys and values it holds
        self.calls = 0

    @torch.no_grad()
    def encoder_call(self, input_ids: torch.Tensor, diffusion_lm: bool, use_cache: bool) -> torch.Tensor:
        """self.diffusion_head(self.encoder(input_ids, past_key_values=cache, use_cache=...)): [1, n, V]."""
        self.calls += 1
        new = input_ids[0].tolist()
        past, n = len(self.cache), len(new)
        mask = torch.ones(past + n, past + n, dtype=torch.bool).tril()
        if diffusion_lm:
            mask[past:, past:] = True
        additive = torch.zeros(mask.shape).masked_fill(
            ~mask, float("-inf")
        )  # a boolean 4D mask reads otherwise
        hidden = self.encoder(
            input_ids=torch.tensor([self.cache + new]), attention_mask=additive[None, None]
        ).last_hidden_state
        if use_cache:
            self.cache += new
        return self.head(hidden[:, past:]).float()

    def crop(self, length: int) -> None:
        del self.cache[length:]


def ar_generate(ref: Reference, prompt_ids: torch.Tensor, max_new_tokens: int, eos_token_id=None):
    next_logit = ref.encoder_call(prompt_ids, diffusion_lm=False, use_cache=True)[:, -1]
    generated_tokens, nfe = [], 0
    for step in range(max_new_tokens):
        nfe += 1
        next_token = torch.argmax(next_logit, dim=-1, keepdim=True)
        generated_tokens.append(next_token)
        if eos_token_id is not None and (next_token == eos_token_id).all():
            break
        if step < max_new_tokens - 1:
            next_logit = ref.encoder_call(next_token, diffusion_lm=False, use_cache=True)[:, -1]
    return torch.cat([prompt_ids, torch.cat(generated_tokens, dim=1)], dim=1), nfe


def _get_num_transfer_tokens(mask_index, steps: int):
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base, remainder = mask_num // steps, mask_num % steps
    num_transfer_tokens = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num_transfer_tokens[i, : int(remainder[i])] += 1
    return num_transfer_tokens


def _get_transfer_index(logits, mask_index, x, num_transfer_tokens, threshold=None):
    x0 = torch.argmax(logits, dim=-1)  # temperature 0: no Gumbel noise
    p = F.softmax(logits, dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool)
    if threshold is not None:
        num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
        transfer_index[j, select_index] = True
        if threshold is not None:
            for k in range(1, int(num_transfer_tokens[j])):
                if confidence[j, select_index[k]] < threshold:
                    transfer_index[j, select_index[k]] = False
    return x0, transfer_index


def _denoise(ref, x_accum, block_slice, block_length, threshold, eos_token_id):
    mask_id = ref.mask_token_id
    num_transfer_tokens = _get_num_transfer_tokens(x_accum[:, block_slice] == mask_id, block_length)
    for i in range(block_length):
        mask_block_idx = x_accum[:, block_slice] == mask_id
        if mask_block_idx.sum() == 0:
            break
        logits_block = ref.encoder_call(x_accum[:, block_slice], diffusion_lm=True, use_cache=False)
        x0, transfer_idx = _get_transfer_index(
            logits_block, mask_block_idx, x_accum[:, block_slice], num_transfer_tokens[:, i], threshold
        )
        cur = x_accum[:, block_slice].clone()
        cur[transfer_idx] = x0[transfer_idx]
        x_accum[:, block_slice] = cur
        if eos_token_id is not None:
            block_tokens = x_accum[:, block_slice]
            eos_mask = block_tokens == eos_token_id
            if eos_mask.any(dim=1).any():
                after_eos = eos_mask.cumsum(dim=1).bool()
                mask_before = (block_tokens == mask_id) & ~after_eos
                if (eos_mask.any(dim=1) & ~mask_before.any(dim=1)).any():
                    break


def generate(ref: Reference, prompt_ids, max_new_tokens, block_length, threshold=None, eos_token_id=None):
    """generate(..., causal_context=True) at temperature 0, without a thinking budget."""
    x_accum, nfe = prompt_ids.clone(), 0
    assert max_new_tokens % block_length == 0
    output = ref.encoder_call(prompt_ids, diffusion_lm=False, use_cache=True)
    next_token = torch.argmax(output[:, -1, :], dim=-1, keepdim=True)
    for num_block in range(max_new_tokens // block_length):
        mask_block = torch.full((1, block_length), ref.mask_token_id, dtype=prompt_ids.dtype)
        mask_block[:, 0] = next_token[:, 0]
        x_accum = torch.cat([x_accum, mask_block], dim=1)
        block_start = prompt_ids.size(1) + num_block * block_length
        block_slice = slice(block_start, block_start + block_length)
        before = ref.calls
        _denoise(ref, x_accum, block_slice, block_length, threshold, eos_token_id)
        nfe += ref.calls - before
        output = ref.encoder_call(x_accum[:, block_slice], diffusion_lm=False, use_cache=True)
        nfe += 1
        next_token = torch.argmax(output[:, -1, :], dim=-1, keepdim=True)
        if eos_token_id is not None:
            is_eos = x_accum[:, prompt_ids.size(1) :] == eos_token_id
            if is_eos.any(dim=1).all():
                first_eos = is_eos.to(torch.int64).argmax(dim=1)
                return x_accum[:, : prompt_ids.size(1) + first_eos.max().item() + 1], nfe
    return x_accum, nfe


def _draft(ref, block, threshold):
    token_mask_id = ref.mask_token_id
    for _ in range(block.shape[1]):  # caidllm's bound (the official `while True` hangs on a predicted mask)
        is_mask = block == token_mask_id
        if not is_mask.any():
            break
        draft_logits = ref.encoder_call(block, diffusion_lm=True, use_cache=False)
        draft_tokens = draft_logits.argmax(dim=-1)
        draft_probs = torch.softmax(draft_logits, dim=-1)
        if threshold > 0:
            draft_conf = torch.gather(draft_probs, -1, draft_tokens.unsqueeze(-1)).squeeze(-1)
            draft_conf = torch.where(is_mask, draft_conf, -torch.inf)
            unmask = draft_conf >= threshold
            if not unmask.any():
                best_idx = draft_conf.view(-1).argmax()
                unmask = torch.zeros_like(is_mask, dtype=torch.bool)
                unmask.view(-1)[best_idx] = True
            block[unmask] = draft_tokens[unmask]
        else:
            block[is_mask] = draft_tokens[is_mask]
            break


def linear_spec_generate(
    ref: Reference, prompt_ids, max_new_tokens, block_length, eos_token_id=None, threshold=0.0
):
    last_logit = ref.encoder_call(prompt_ids, diffusion_lm=False, use_cache=True)[:, -1]
    nfe = 1
    next_token = torch.argmax(last_logit, dim=-1, keepdim=True)
    if eos_token_id is not None and next_token.item() == eos_token_id:
        return torch.cat([prompt_ids, next_token], dim=1), nfe
    generated, total_gen = [next_token], 1
    while total_gen < max_new_tokens:
        cache_len = len(ref.cache)
        block = torch.full((1, block_length), ref.mask_token_id, dtype=torch.long)
        block[0, 0] = next_token.item()
        before = ref.calls
        _draft(ref, block, threshold)
        nfe += ref.calls - before
        verify_logits = ref.encoder_call(block, diffusion_lm=False, use_cache=True)
        nfe += 1
        ar_tokens = verify_logits.argmax(dim=-1)
        accepted = 0
        for i in range(block_length - 1):
            if ar_tokens[0, i].item() == block[0, i + 1].item():
                accepted += 1
            else:
                break
        accepted += 1
        accepted_toks = ar_tokens[:, :accepted]
        generated.append(accepted_toks)
        total_gen += accepted
        ref.crop(cache_len + accepted)
        next_token = ar_tokens[:, accepted - 1 : accepted]
        if eos_token_id is not None:
            eos_pos = (accepted_toks[0] == eos_token_id).nonzero(as_tuple=True)[0]
            if len(eos_pos) > 0:
                generated[-1] = accepted_toks[:, : eos_pos[0].item() + 1]
                break
        if total_gen >= max_new_tokens:
            break
    return torch.cat([prompt_ids, torch.cat(generated, dim=1)], dim=1), nfe
