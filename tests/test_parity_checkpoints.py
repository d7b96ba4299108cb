"""Logits parity with the official forwards, re-stated plainly here from the official modeling
files' facts (LLaDA-MoE's modeling_lladamoe.py; Dream's modeling_dream.py, which Dream-Coder and
DiffuCoder ship unchanged) and run on the tensors of the tiny folders by their official names:
fp32, no padding, max abs difference at the 1e-5 level."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import caidllm
from helpers.checkpoint_files import write_checkpoint


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotary(x, positions, theta):
    """Rotate-half RoPE over the whole head (partial_rotary_factor 1), tables as the official ones."""
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = positions[:, None].float() * inv_freq[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    half = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], dim=-1)
    return x * emb.cos() + half * emb.sin()


def attention(x, w, p, cfg, heads, kv_heads, qk_norm, bias):
    B, L, _ = x.shape
    hd = cfg["hidden_size"] // heads

    def proj(name):
        y = x @ w[f"{p}self_attn.{name}_proj.weight"].T
        return y + w[f"{p}self_attn.{name}_proj.bias"] if bias else y

    q, k, v = proj("q"), proj("k"), proj("v")
    if qk_norm:  # LLaDA-MoE: RMSNorm over each head's head_dim, one weight for all heads
        q = rms_norm(q.reshape(-1, hd), w[p + "self_attn.q_norm.weight"], cfg["rms_norm_eps"]).reshape(
            B, L, -1
        )
        k = rms_norm(k.reshape(-1, hd), w[p + "self_attn.k_norm.weight"], cfg["rms_norm_eps"]).reshape(
            B, L, -1
        )
    q = q.view(B, L, heads, hd).transpose(1, 2)
    k = k.view(B, L, kv_heads, hd).transpose(1, 2)
    v = v.view(B, L, kv_heads, hd).transpose(1, 2)
    positions = torch.arange(L)
    q, k = rotary(q, positions, cfg["rope_theta"]), rotary(k, positions, cfg["rope_theta"])
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = (q @ k.transpose(2, 3)) / hd**0.5  # bidirectional: no mask at all
    out = scores.softmax(-1) @ v
    return out.transpose(1, 2).reshape(B, L, -1) @ w[p + "self_attn.o_proj.weight"].T


def swiglu(x, w, p):
    return (F.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[
        p + "down_proj.weight"
    ].T


def sparse_moe(x, w, p, cfg):
    """The official sparse block: softmax over all experts (fp32), the top-k weights as they are
    (not renormalised), each token's output the weighted sum of its k experts."""
    flat = x.reshape(-1, x.shape[-1])
    probs = F.softmax(flat @ w[p + "mlp.gate.weight"].T, dim=1, dtype=torch.float)
    weights, chosen = probs.topk(cfg["num_experts_per_tok"], dim=-1)
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for j in range(chosen.shape[1]):
            out[t] += weights[t, j] * swiglu(flat[t], w, f"{p}mlp.experts.{int(chosen[t, j])}.")
    return out.view_as(x)


def official_forward(weights, cfg, ids, moe):
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    h = weights["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = h + attention(
            rms_norm(h, weights[p + "input_layernorm.weight"], cfg["rms_norm_eps"]),
            weights,
            p,
            cfg,
            heads,
            kv_heads,
            qk_norm=moe,
            bias=not moe,
        )
        x = rms_norm(h, weights[p + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
        h = h + (sparse_moe(x, weights, p, cfg) if moe else swiglu(x, weights, p + "mlp."))
    return rms_norm(h, weights["model.norm.weight"], cfg["rms_norm_eps"]) @ weights["lm_head.weight"].T


def _weights(folder):
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.mark.parametrize(
    "hub_id",
    [
        "inclusionAI/LLaDA-MoE-7B-A1B-Instruct",
        "apple/DiffuCoder-7B-Instruct",
        "Dream-org/Dream-Coder-v0-Instruct-7B",
    ],
)
def test_logits_equal_the_official_forward(tmp_path, hub_id):
    import json

    folder = write_checkpoint(tmp_path, hub_id, seed=3)
    cfg = json.loads((folder / "config.json").read_text())
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    moe = lm.config.moe is not None
    ids = torch.randint(0, lm.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = official_forward(_weights(folder), cfg, ids, moe)
    if not moe:  # Dream: the logit for position i comes from i-1; position 0 keeps its own
        expected = torch.cat([expected[:, :1], expected[:, :-1]], dim=1)
    got = lm.logits(ids)
    assert (got - expected).abs().max().item() < 1e-5
