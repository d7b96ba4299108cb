"""A plain re-statement of NVlabs Fast-dLLM v2 (its modeling file's forward at inference and its
``generate``), for parity tests: batch 1, float32, straight from a checkpoint's safetensors, with
none of caidllm's modules.

Forward (``Fast_dLLM_QwenForCausalLM`` in eval mode): Qwen2.5's layers; RoPE positions continue
the cache (``past_key_values``), and with the within-block cache they start at the sub-block's
offset (``replace_position``); the attention mask is the block-causal ``eval_mask`` (query block >=
key block) except when a within-block cache already exists, where there is none; the within-block
cache's keys/values are the block's whole forward's, the sub-block's overwritten in place, read
after the finished blocks'. Logits are raw (position i's logit predicts token i + 1).

Generator (``generate``, greedy): the prompt's complete blocks are prefilled (and when the prompt
ends on a block boundary, the next token is the argmax of its last logit); then block after block,
masks to the next block boundary, decoded sub-block by sub-block: every step reads the block's
shifted logits (``cat(logits[:, :1], logits[:, :-1])``) and commits, of the sub-block's masked
positions, those with probability strictly above the threshold and always the most probable; a
completed block is forwarded once more into the cache and its last logit gives the next block's
first token. Decoding stops once the stop token is decoded with nothing masked before it.
Two readings of caidllm's are kept here (rows of the deviation table in
docs/block-diffusion-decoding.md): the mask token is never predicted (its logit is -inf before
the softmax), and any of ``stop_ids`` stops (the official code has one ``stop_token``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class OfficialFastDLLMv2:
    def __init__(self, folder):
        folder = Path(folder)
        self.c = json.loads((folder / "config.json").read_text())
        self.w = {}
        for file in sorted(folder.glob("*.safetensors")):
            self.w.update({k: v.float() for k, v in load_file(str(file)).items()})
        c = self.c
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        self.mask_id = c["mask_token_id"]

    def _norm(self, x, name):
        return self.w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"]))

    def _rope(self, x, positions):
        hd = self.head_dim
        inv = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        freqs = positions.float()[:, None] * inv[None]
        emb = torch.cat([freqs, freqs], -1)
        half = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
        return x * emb.cos() + half * emb.sin()

    def forward(
        self, ids, past=None, update_past=False, block_cache=None, replace_position=None, block_size=32
    ):
        """ids [n]; past: list of (k, v) per layer ([kv_heads, L, hd]) or None; block_cache: None (not
        used), [] (make one) or the block's list. Returns raw logits [n, V]."""
        n, past_len = len(ids), (past[0][0].shape[1] if past else 0)
        offset = past_len + (replace_position or 0) if block_cache is not None else past_len
        positions = offset + torch.arange(n)
        if block_cache is not None and len(block_cache) > 0:
            mask = None
        else:
            q, k = torch.arange(n) + past_len, torch.arange(n + past_len)
            mask = (q[:, None] // block_size) >= (k[None, :] // block_size)
        making_block_cache = block_cache is not None and len(block_cache) == 0
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self._norm(x, p + "input_layernorm.weight")
            q, k, v = (
                F.linear(h, self.w[p + f"self_attn.{m}_proj.weight"], self.w[p + f"self_attn.{m}_proj.bias"])
                for m in "qkv"
            )
            q = self._rope(q.view(n, self.heads, -1).transpose(0, 1), positions)
            k = self._rope(k.view(n, self.kv_heads, -1).transpose(0, 1), positions)
            v = v.view(n, self.kv_heads, -1).transpose(0, 1)
            if block_cache is not None:
                if making_block_cache:
                    block_cache.append((k, v))
                else:
                    bk, bv = block_cache[i]
                    (
                        bk[:, replace_position : replace_position + n],
                        bv[:, replace_position : replace_position + n],
                    ) = k, v
                    k, v = bk, bv
            if past is not None:
                if update_past:
                    if i < len(past):  # the cache grows by these positions (DynamicCache.update)
                        past[i] = (torch.cat([past[i][0], k], 1), torch.cat([past[i][1], v], 1))
                    else:
                        past.append((k, v))
                    k, v = past[i]
                elif i < len(past):
                    k, v = torch.cat([past[i][0], k], 1), torch.cat([past[i][1], v], 1)
            groups = self.heads // self.kv_heads
            k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
            scores = q @ k.transpose(1, 2) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            attn = scores.softmax(-1) @ v
            x = x + F.linear(attn.transpose(0, 1).reshape(n, -1), self.w[p + "self_attn.o_proj.weight"])
            h = self._norm(x, p + "post_attention_layernorm.weight")
            gate, up = (F.linear(h, self.w[p + f"mlp.{m}_proj.weight"]) for m in ("gate", "up"))
            x = x + F.linear(F.silu(gate) * up, self.w[p + "mlp.down_proj.weight"])
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        return F.linear(self._norm(x, "model.norm.weight"), head)

    def _greedy(self, logits):
        logits = logits.clone()
        logits[:, self.mask_id] = float("-inf")
        p = logits.softmax(-1)  # in the logits' dtype, as sample_with_top_p at temperature 0
        x = p.argmax(-1)
        return x, p.gather(-1, x[:, None])[:, 0]

    def generate(
        self,
        prompt,
        max_new_tokens,
        *,
        threshold,
        small_block_size,
        block_size,
        stop_ids,
        use_block_cache,
        step=None,
        next_token=None,
    ):
        """The generated tokens (after the prompt), cut after the first stop id. step(x, lo, s, size, past):
        another decoder's sub-block step in the same loop (S2D2's, s2d2_reference.py); next_token(logits):
        the next block's first token from the last logit (default: its argmax)."""
        next_token = next_token or (lambda logits: logits[-1:].argmax(-1))
        x = torch.tensor(prompt)
        P, past = len(prompt), None
        if P > block_size:
            past = []
            logits = self.forward(
                x[: P // block_size * block_size], past, update_past=True, block_size=block_size
            )
            if P % block_size == 0:
                x = torch.cat([x, next_token(logits)])
        for _ in range(max_new_tokens // block_size):
            if any(int(t) in stop_ids for t in x[P:]):
                break
            start_new = len(x)
            x = torch.cat([x, torch.full((block_size - len(x) % block_size,), self.mask_id)])
            lo = len(x) - block_size
            block_cache = None
            while True:
                if self._stopped(x, start_new, stop_ids):
                    break
                if not (x[lo:] == self.mask_id).any():
                    past = past if past is not None else []
                    logits = self.forward(x[lo:], past, update_past=True, block_size=block_size)
                    x = torch.cat([x, next_token(logits)])
                    break
                for s in range(0, block_size, small_block_size):
                    while (x[lo + s : lo + s + small_block_size] == self.mask_id).any():
                        if self._stopped(x, start_new, stop_ids):
                            break
                        if step is not None:
                            step(x, lo, s, small_block_size, past)
                            continue
                        logits = self._step_logits(
                            x, lo, s, small_block_size, past, use_block_cache, block_cache
                        )
                        if use_block_cache and isinstance(logits, tuple):
                            logits, block_cache = logits
                        sub = x[lo + s : lo + s + small_block_size]
                        pred, prob = self._greedy(logits)
                        prob = torch.where(
                            sub == self.mask_id, prob, torch.tensor(-math.inf, dtype=prob.dtype)
                        )
                        take = prob > threshold
                        take[prob.argmax()] = True
                        take &= sub == self.mask_id
                        sub[take] = pred[take]
        out = x[P:].tolist()
        for i, t in enumerate(out):
            if t in stop_ids:
                return out[: i + 1]
        return out

    def _step_logits(self, x, lo, s, size, past, use_block_cache, block_cache):
        """The sub-block's shifted logits [size, V] (with the within-block cache: and the cache)."""
        if use_block_cache and block_cache is not None and x[lo + s] != self.mask_id:
            logits = self.forward(
                x[lo + s : lo + s + size], past, block_cache=block_cache, replace_position=s
            )
            return torch.cat([logits[:1], logits[:-1]])
        fresh = [] if use_block_cache else None
        logits = self.forward(x[lo:], past, block_cache=fresh)
        logits = torch.cat([logits[:1], logits[:-1]])[s : s + size]
        return (logits, fresh) if use_block_cache else logits

    def _stopped(self, x, start_new, stop_ids):
        new = x[start_new:].tolist()
        first = next((i for i, t in enumerate(new) if t in stop_ids), None)
        return first is not None and self.mask_id not in new[:first]
