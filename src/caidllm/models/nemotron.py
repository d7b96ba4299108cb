"""Nemotron-Labs-Diffusion (NVIDIA, ``NemotronLabsDiffusionModel``, model_type ``nemotron_labs_diffusion``):
one dense Ministral-3 checkpoint trained both as a causal language model and as a bidirectional
denoiser, so that one set of weights decodes three ways by switching its attention pattern
(``modeling_nemotron_labs_diffusion.py``: ``ar_generate``, ``generate``, ``linear_spec_generate``;
the decoders are decode/nemotron.py's).

The forward (``run``) takes a KV cache of the tokens already decided (written only by causal forwards)
and a row of new tokens, and attends either causally (the attention layers' ``diffusion_lm = False``:
each new token sees the cache and the new tokens up to itself; the head then predicts the *next*
token) or bidirectionally (``diffusion_lm = True``: every new token sees the cache and every new
token; the head predicts each position's own token, LLaDA style). ``write`` appends the new tokens'
keys and values to the cache (the official ``use_cache=True``); otherwise they are attended and
dropped (``use_cache=False``, the draft and denoising forwards).

Layout (transformers' Ministral3, which the hub's ``modeling_ministral.py`` copies): RMSNorm before
attention and MLP, grouped-query attention without biases, RoPE (YaRN from ``rope_parameters``) on
whole heads with cos / sin cast to the activations' dtype, then the query scaled by Llama-4's
``1 + beta * log(1 + floor(position / original_max_position_embeddings))``, SwiGLU. Module names mirror
the checkpoint: encoder.{embed_tokens, layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}, norm}, diffusion_head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import Family, ModelConfig
from .layers import RMSNorm, apply_rope, swiglu
from .nemotron_config import inverse_frequencies, read_nemotron_fields, rope_parameters


class NLDCache:
    """The keys and values of the decided tokens, per layer ([B, kv_heads, n, head_dim]); cropped back
    when a verify pass keeps only its accepted prefix (the official ``_crop_dynamic_cache``)."""

    def __init__(self, n_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def crop(self, length: int) -> None:
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k is not None:
                self.keys[i], self.values[i] = k[:, :, :length], v[:, :, :length]

    def joined(self, layer: int, k: torch.Tensor, v: torch.Tensor, write: bool):
        """The cache's keys / values with k, v appended (stored only when write)."""
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None:
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        if write:
            self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, h, kv, hd = config.hidden_size, config.n_heads, config.n_kv_heads, config.head_dim
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.head_dim, self.groups = hd, h // kv

    def forward(self, x, rope, layer: int, cache: NLDCache, causal: bool, write: bool) -> torch.Tensor:
        b, n, _ = x.shape
        cos, sin, q_scale = rope
        q = self.q_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin, fp32=False), apply_rope(k, cos, sin, fp32=False)
        q = q * q_scale.to(q.dtype)
        k, v = cache.joined(layer, k, v, write)
        mask = None
        if causal:  # query i (at cache length + i) sees keys up to its own position
            past = k.shape[2] - n
            mask = torch.ones(n, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=past)
        out = F.scaled_dot_product_attention(
            q, k.repeat_interleave(self.groups, 1), v.repeat_interleave(self.groups, 1), attn_mask=mask
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_proj, self.up_proj, self.down_proj)


class Layer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class Encoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class NemotronLabsDiffusionModel(nn.Module):
    """The checkpoint's module; ``run`` is its one forward (module docstring)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.cfg = config
        self.encoder = Encoder(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = rope_parameters(config.raw, "config.json") if config.raw else {"rope_type": "default"}
        self.rope.setdefault("rope_theta", config.rope_theta)
        self._frequencies: dict = {}  # per device: (inv_freq, attention factor), computed at first use

    def new_cache(self) -> NLDCache:
        return NLDCache(self.cfg.n_layers)

    def rotary(self, start: int, n: int, device, dtype):
        """cos / sin [1, 1, n, head_dim] (scaled by YaRN's attention factor) and the Llama-4 query
        scale [1, 1, n, 1] of absolute positions start .. start + n - 1."""
        key = str(device)
        if key not in self._frequencies:
            self._frequencies[key] = inverse_frequencies(self.rope, self.cfg.head_dim, device)
        inv_freq, factor = self._frequencies[key]
        positions = torch.arange(start, start + n, device=device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)[None, None]
        cos, sin = (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)
        beta = self.rope.get("llama_4_scaling_beta")
        original = self.rope.get("original_max_position_embeddings")
        scale = torch.ones_like(positions)
        if beta is not None and original is not None:
            scale = 1 + beta * torch.log(1 + torch.floor(positions / original))
        return cos, sin, scale[None, None, :, None]

    @torch.no_grad()
    def run(self, ids: torch.Tensor, cache: NLDCache, causal: bool, write: bool) -> torch.Tensor:
        """Float32 logits [B, n, V] of the new tokens ids [B, n] after the cache's tokens (module
        docstring: causal or bidirectional attention; write: keep their keys and values)."""
        x = self.encoder.embed_tokens(ids)
        rope = self.rotary(cache.length, ids.shape[1], ids.device, x.dtype)
        for i, layer in enumerate(self.encoder.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), rope, i, cache, causal, write)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.diffusion_head(self.encoder.norm(x)).float()


# Its own decoders (decode/nemotron.py): ar, nemotron (block diffusion), linear-spec; not the mask engine's.
NEMOTRON_LABS_DIFFUSION = Family(
    name="nemotron_labs_diffusion",
    architectures=("NemotronLabsDiffusionModel",),
    model_types=("nemotron_labs_diffusion",),
    read_fields=read_nemotron_fields,
    model_class=NemotronLabsDiffusionModel,
    confidence_gating=False,
    cache_refresh_every=32,
    description="Nemotron-Labs-Diffusion (NVIDIA): Ministral-3, one checkpoint for AR, block diffusion "
    "and self-speculation (LinearSpec)",
    sequential=True,
    mask_from_config=True,
)
