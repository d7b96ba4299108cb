"""DiffusionGemma (Google, ``DiffusionGemmaForBlockDiffusion``, model_type ``diffusion_gemma``): uniform-state
block diffusion on a Gemma-4 MoE backbone, text path.

One set of weights plays two roles. As a causal *encoder* it runs over the prompt and each finished
canvas and writes their keys and values (DGCache); as a bidirectional *decoder* it runs over the canvas
(random tokens being denoised), reads that cache, and adds *self-conditioning*: the previous step's
logits as soft embeddings (softmax @ embedding matrix) through a gated MLP before the first layer.
Each layer: attention (QK-norm, a scale-free V-norm, scale 1), then a dense GELU-tanh MLP and 128-way
routed experts side by side, each with its own norms, summed, a per-layer scalar. Sliding-window
layers (head 256) interleave with full layers (head 512, fewer key/value heads, V = K, proportional
RoPE); the logits are soft-capped (30 tanh(x / 30)).

Module names mirror the official checkpoint: model.decoder.{embed_tokens, layers.{i}.{self_attn.
{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj, router.{proj.weight, scale,
per_expert_scale}, experts.{gate_up_proj, down_proj}, *layernorm*, layer_scalar}, norm,
self_conditioning.*}; the encoder's copies are tied to these (only its layer_scalar buffers are
stored apart: model.encoder.language_model.layers.{i}.layer_scalar). The vision tower's tensors
(model.encoder.vision_tower.*, model.encoder.embed_vision.*) are not loaded: text only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import Family, ModelConfig
from .diffusion_gemma_cache import DecoderView, DGCache, causal_mask
from .diffusion_gemma_config import (
    FULL,
    SLIDING,
    DGShape,
    dg_shape,
    dg_tp_sizes,
    read_diffusion_gemma_fields,
)
from .diffusion_gemma_layers import (
    DGExperts,
    DGNorm,
    GatedMLP,
    Router,
    gelu_tanh,
    rotate,
)
from .moe_kernels import AUTO, run_experts

VISION_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, shape: DGShape, layer: int):
        super().__init__()
        d, h = config.hidden_size, config.n_heads
        self.head_dim, kv = shape.head_dim(layer, config), shape.kv_heads(layer, config)
        self.sliding = shape.layer_types[layer] == SLIDING
        self.window = shape.sliding_window if self.sliding else None
        self.q_proj = nn.Linear(d, h * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv * self.head_dim, bias=False) if self.sliding else None  # full: V = K
        self.o_proj = nn.Linear(h * self.head_dim, d, bias=False)
        self.q_norm = DGNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = DGNorm(self.head_dim, config.rms_norm_eps)
        self.v_norm = DGNorm(self.head_dim, config.rms_norm_eps, scaled=False)
        self.groups = h // kv

    def project(self, x: torch.Tensor, cos, sin):
        """q [B, h, n, hd], k / v [B, kv, n, hd] of x [B, n, d]."""
        b, n, _ = x.shape
        q = rotate(self.q_norm(self.q_proj(x).view(b, n, -1, self.head_dim)), cos, sin)
        raw_k = self.k_proj(x).view(b, n, -1, self.head_dim)
        raw_v = raw_k if self.v_proj is None else self.v_proj(x).view(b, n, -1, self.head_dim)
        k = rotate(self.k_norm(raw_k), cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), self.v_norm(raw_v).transpose(1, 2)

    def attend(self, q, k, v, mask: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        b, _, n, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class Layer(nn.Module):
    """Attention, then the dense MLP and the routed experts side by side (routing reads the residual)."""

    kernel = AUTO  # models/moe.py's set_moe_kernel sets it (runs_experts)
    runs_experts = True

    def __init__(self, config: ModelConfig, shape: DGShape, layer: int):
        super().__init__()
        d, eps, moe = config.hidden_size, config.rms_norm_eps, config.moe
        self.self_attn = Attention(config, shape, layer)
        self.mlp = GatedMLP(d, config.intermediate_size)
        for name in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
            "post_feedforward_layernorm_1",
            "post_feedforward_layernorm_2",
            "pre_feedforward_layernorm_2",
        ):
            setattr(self, name, DGNorm(d, eps))
        self.router = Router(d, moe.num_experts, moe.num_experts_per_tok, eps)
        self.experts = DGExperts(moe.num_experts, d, moe.moe_intermediate_size)
        self.register_buffer("layer_scalar", torch.ones(1))

    def draw_random(self, generator: torch.Generator) -> None:
        self.layer_scalar.fill_(1.0)

    def forward(self, x, attention, scalar: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(attention(self.input_layernorm(x)))
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        chosen, weights = self.router(x)
        routed = self.route(self.pre_feedforward_layernorm_2(x), chosen, weights)
        routed = self.post_feedforward_layernorm_2(routed)
        return (x + self.post_feedforward_layernorm(dense + routed)) * scalar

    def route(self, inputs: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The routed experts' sum [B, n, d] (parallel/diffusion_gemma.py: a rank's experts, summed over
        the ranks). Each request's tokens go through the experts on their own: how many rows an expert
        gets (and so the matmul path it takes) must not depend on the batch (batch invariance)."""
        return torch.stack(
            [
                run_experts(self.experts, self.kernel, inputs[b], chosen[b], weights[b])
                for b in range(inputs.shape[0])
            ]
        )


class SelfConditioning(nn.Module):
    """post_norm(embeddings + gated MLP(pre_norm(soft embeddings of the previous step's logits)))."""

    def __init__(self, d: int, inner: int, eps: float):
        super().__init__()
        self.pre_norm, self.post_norm = DGNorm(d, eps), DGNorm(d, eps, scaled=False)
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, embeddings: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        s = self.pre_norm(soft)
        return self.post_norm(embeddings + self.down_proj(gelu_tanh(self.gate_proj(s)) * self.up_proj(s)))


class Backbone(nn.Module):
    def __init__(self, config: ModelConfig, shape: DGShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config, shape, i) for i in range(config.n_layers))
        self.norm = DGNorm(config.hidden_size, config.rms_norm_eps)
        self.self_conditioning = SelfConditioning(
            config.hidden_size, config.intermediate_size, config.rms_norm_eps
        )


class EncoderScalars(nn.Module):
    """model.encoder.language_model.layers.{i}.layer_scalar: the encoder's per-layer scalars, the
    one part of its layers the checkpoint does not tie to the decoder's."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.language_model = nn.Module()
        self.language_model.layers = nn.ModuleList(Scalar() for _ in range(n_layers))


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("layer_scalar", torch.ones(1))

    def draw_random(self, generator: torch.Generator) -> None:
        self.layer_scalar.fill_(1.0)


class DiffusionGemmaModel(nn.Module):
    """encode(ids, cache) writes keys/values; denoise(canvas, view, soft) returns float32 soft-capped
    logits of the canvas. See the module docstring."""

    extra_left = 0  # what the mask engine's checks read of a model (no shifted logits here)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config, self.shape = config, dg_shape(config.raw, "config.json")
        self.model = nn.Module()
        self.model.decoder = Backbone(config, self.shape)
        self.model.encoder = EncoderScalars(config.n_layers)
        self.embed_scale = config.hidden_size**0.5

    @property
    def cfg(self) -> ModelConfig:  # what quantize.py / plan.py read of a model
        return self.config

    def cache_bytes(self, length: int, size: int) -> int:
        """Bytes of one request's cache at `length` positions: keys and values of every layer (a sliding
        layer's too: the per-request cache keeps all of them), V = K stored apart in the full layers."""
        c = self.config
        per_position = sum(
            2 * self.shape.kv_heads(i, c) * self.shape.head_dim(i, c) for i in range(c.n_layers)
        )
        return per_position * length * size

    @property
    def backbone(self) -> Backbone:
        return self.model.decoder

    def _load_from_state_dict(self, state_dict, prefix, *args):
        # The tied encoder copies and the vision tower are not this module's: dropped, never an error.
        for name in [n for n in state_dict if n.startswith(prefix + "model.encoder.")]:
            rest = name[len(prefix) :]
            if rest.startswith(VISION_PREFIXES) or (
                rest.startswith("model.encoder.language_model.") and not rest.endswith("layer_scalar")
            ):
                del state_dict[name]
        state_dict.pop(prefix + "lm_head.weight", None)  # tied to the embedding
        super()._load_from_state_dict(state_dict, prefix, *args)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.backbone.embed_tokens.weight
        return F.embedding(ids, w) * torch.tensor(self.embed_scale, dtype=w.dtype)

    def rope(self, positions: torch.Tensor, kind: str, head_dim: int, dtype):
        """cos, sin [B, n, head_dim] for positions [B, n]."""
        spec = self.shape.rope[kind]
        pairs = int(spec.partial * head_dim // 2) if spec.kind == "proportional" else head_dim // 2
        inv = 1.0 / spec.theta ** (torch.arange(0, 2 * pairs, 2, dtype=torch.float) / head_dim)
        inv = F.pad(inv, (0, head_dim // 2 - pairs)).to(positions.device)
        angles = positions[..., None].float() * inv
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _ropes(self, positions, dtype) -> dict:
        c = self.config
        return {
            kind: self.rope(
                positions, kind, c.head_dim if kind == SLIDING else self.shape.full_head_dim, dtype
            )
            for kind in (SLIDING, FULL)
        }

    def encode(self, ids: torch.Tensor, cache: DGCache) -> torch.Tensor:
        """Run the causal encoder over ids [B, n] after the cached positions, appending their keys/values;
        returns its final (normed) hidden states [B, n, hidden]."""
        start, (b, n) = cache.length, ids.shape
        x = self.embed(ids)
        positions = torch.arange(start, start + n, device=ids.device).expand(b, n)
        ropes = self._ropes(positions, x.dtype)
        scalars = self.model.encoder.language_model.layers
        for i, layer in enumerate(self.backbone.layers):
            attn = layer.self_attn

            def attention(h, attn=attn, i=i):
                q, k, v = attn.project(h, *ropes[self.shape.layer_types[i]])
                k, v = cache.append(i, k, v)
                return attn.attend(q, k, v, causal_mask(start, n, attn.window, ids.device))

            x = layer(x, attention, scalars[i].layer_scalar)
        return self.backbone.norm(x)

    def denoise(
        self, canvas: torch.Tensor, view: DecoderView, soft: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Float32 logits [B, L, V] of canvas [B, L] over the cached prefix of each row; `soft`
        [B, L, hidden]: the self-conditioning soft embeddings (soft_embeddings), None at a first step."""
        n = canvas.shape[1]
        x = self.embed(canvas)
        x = self.backbone.self_conditioning(x, soft if soft is not None else torch.zeros_like(x))
        positions = torch.tensor(view.lengths, device=canvas.device)[:, None] + torch.arange(
            n, device=canvas.device
        )
        ropes = self._ropes(positions, x.dtype)
        for i, layer in enumerate(self.backbone.layers):
            attn, kind = layer.self_attn, self.shape.layer_types[i]

            def attention(h, attn=attn, i=i, kind=kind):
                q, k, v = attn.project(h, *ropes[kind])
                rows = []
                for r in range(h.shape[0]):  # each row over its own cached keys: no padding (DecoderView)
                    ck, cv = view.cached(r, i, attn.window)
                    kr, vr = (
                        (k[r : r + 1], v[r : r + 1])
                        if ck is None
                        else (torch.cat([ck, k[r : r + 1]], dim=2), torch.cat([cv, v[r : r + 1]], dim=2))
                    )
                    rows.append(attn.attend(q[r : r + 1], kr, vr, None))
                return torch.cat(rows)

            x = layer(x, attention, layer.layer_scalar)
        return self.logits(self.backbone.norm(x))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, self.backbone.embed_tokens.weight).float()
        cap = self.shape.softcap
        if cap is None:
            return logits
        if torch.is_grad_enabled() and logits.requires_grad:  # training: autograd needs the intermediate
            return torch.tanh(logits / cap) * cap
        # in place: the [B, L, vocab] float32 logits are the one full-size tensor a step holds
        return logits.div_(cap).tanh_().mul_(cap)

    def soft_embeddings(self, logits: torch.Tensor, chunk: int = 64) -> torch.Tensor:
        """softmax(logits) @ embedding * sqrt(hidden), [B, L, hidden], `chunk` positions at a time (the
        float32 probabilities of a whole canvas are never held at once)."""
        w = self.backbone.embed_tokens.weight
        scale = torch.tensor(self.embed_scale, dtype=w.dtype)
        flat = logits.reshape(-1, logits.shape[-1])
        out = torch.empty(flat.shape[0], w.shape[1], dtype=w.dtype, device=w.device)
        for s in range(0, flat.shape[0], chunk):
            # the logits in the weights' dtype first, as the reference keeps them between steps
            probs = flat[s : s + chunk].to(w.dtype).softmax(dim=-1, dtype=torch.float32).to(w.dtype)
            out[s : s + chunk] = (probs @ w) * scale
        return out.view(*logits.shape[:-1], w.shape[1])


def ignored_weight(name: str) -> bool:
    """Checkpoint tensors the loader skips: the vision tower and the encoder's copies tied to the decoder."""
    return (
        name.startswith(VISION_PREFIXES)
        or name == "lm_head.weight"
        or (name.startswith("model.encoder.language_model.") and not name.endswith(".layer_scalar"))
    )


DIFFUSION_GEMMA = Family(
    name="diffusion_gemma",
    architectures=("DiffusionGemmaForBlockDiffusion",),
    model_types=("diffusion_gemma",),
    read_fields=read_diffusion_gemma_fields,
    model_class=DiffusionGemmaModel,
    confidence_gating=False,
    cache_refresh_every=0,
    description="DiffusionGemma (Google): uniform-state block diffusion, Gemma-4 MoE, canvases of 256",
    block_causal=True,
    uniform=True,
    ignores_weight=ignored_weight,
    tp_sizes=dg_tp_sizes,
)
