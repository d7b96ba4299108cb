"""LLaDA2 and SDAR load from folders in the official layout (tests/block_checkpoints.py) and
their logits equal a plain re-statement of the official forwards (fp32, random weights), with
a full attention mask and with the official block-causal mask (blocks of block_length from
position 0, lower-triangular over blocks, as the official generate() builds it)."""

import pytest
import torch

import caidllm
from block_checkpoints import write_block_checkpoint
from caidllm.models.layers import Context
from caidllm.models.modes import FORWARD_MODES

KINDS = ("llada2", "sdar", "sdar-moe")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for kind in KINDS:
        folder = write_block_checkpoint(tmp_path_factory.mktemp(kind), kind, seed=len(out))
        out[kind] = caidllm.load(folder, device="cpu", dtype="float32")
    return out


# ---- the official forwards, re-stated -----------------------------------------------


def rms(x, weight, eps):
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, rotary_dim, theta):
    """Rotate-half RoPE on the first rotary_dim dimensions of x [B, H, L, hd], positions 0..L-1."""
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    freqs = torch.arange(x.shape[2]).float()[:, None] * inv_freq[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    rot, kept = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    turned = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * emb.cos() + turned * emb.sin(), kept], dim=-1)


def attention(q, k, v, additive_mask):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    weights = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + additive_mask
    return weights.softmax(dim=-1) @ v


def block_causal_mask(length, block):
    blocks = length // block
    visible = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(block, 0).repeat_interleave(block, 1)
    return visible.log()  # 0 where visible, -inf elsewhere


def swiglu(x, sd, prefix):
    gate = x @ sd[prefix + "gate_proj.weight"].T
    return (torch.nn.functional.silu(gate) * (x @ sd[prefix + "up_proj.weight"].T)) @ sd[
        prefix + "down_proj.weight"
    ].T


def llada2_experts(x, sd, prefix, c):
    """LLaDA2MoeGate + LLaDA2MoeSparseMoeBlock, one token at a time."""
    out = []
    per_group = c["num_experts"] // c["n_group"]
    for token in x.reshape(-1, x.shape[-1]):
        scores = torch.sigmoid(sd[prefix + "gate.weight"] @ token)
        biased = scores + sd[prefix + "gate.expert_bias"]
        group_scores = biased.view(c["n_group"], per_group).topk(2).values.sum(-1)
        groups = group_scores.topk(c["topk_group"]).indices
        allowed = torch.zeros(c["n_group"], dtype=torch.bool)
        allowed[groups] = True
        chosen = (
            biased.masked_fill(~allowed.repeat_interleave(per_group), float("-inf"))
            .topk(c["num_experts_per_tok"])
            .indices
        )
        weights = scores[chosen] / (scores[chosen].sum() + 1e-20) * c["routed_scaling_factor"]
        y = sum(w * swiglu(token, sd, f"{prefix}experts.{int(e)}.") for e, w in zip(chosen, weights))
        out.append(y + swiglu(token, sd, prefix + "shared_experts."))
    return torch.stack(out).view_as(x)


def qwen3_experts(x, sd, prefix, c):
    """Qwen3-MoE's sparse block (SDAR-30B-A3B): softmax, top-k, weights normalised."""
    out = []
    for token in x.reshape(-1, x.shape[-1]):
        probs = torch.softmax(sd[prefix + "gate.weight"] @ token, dim=0)
        top = probs.topk(c["num_experts_per_tok"])
        weights = top.values / top.values.sum() if c["norm_topk_prob"] else top.values
        out.append(
            sum(w * swiglu(token, sd, f"{prefix}experts.{int(e)}.") for e, w in zip(top.indices, weights))
        )
    return torch.stack(out).view_as(x)


def official_logits(lm, ids, additive_mask):
    c, sd = lm.config.raw, lm.model.state_dict()
    llada2 = lm.config.family == "llada2"
    B, L = ids.shape
    h, kv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    rotary = int(hd * c["partial_rotary_factor"]) if llada2 else hd
    x = sd["model.word_embeddings.weight" if llada2 else "model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms(x, sd[p + "input_layernorm.weight"], eps)
        if llada2:
            qkv = (y @ sd[p + "attention.query_key_value.weight"].T).view(B, L, h + 2 * kv, hd)
            q, k, v = (t.transpose(1, 2) for t in qkv.split([h, kv, kv], dim=2))
            q, k = (
                rms(q, sd[p + "attention.query_layernorm.weight"], eps),
                rms(k, sd[p + "attention.key_layernorm.weight"], eps),
            )
        else:
            q, k, v = (
                (y @ sd[p + f"self_attn.{n}_proj.weight"].T).view(B, L, -1, hd).transpose(1, 2) for n in "qkv"
            )
            q, k = (
                rms(q, sd[p + "self_attn.q_norm.weight"], eps),
                rms(k, sd[p + "self_attn.k_norm.weight"], eps),
            )
        q, k = rope(q, rotary, c["rope_theta"]), rope(k, rotary, c["rope_theta"])
        o = attention(q, k, v, additive_mask).transpose(1, 2).reshape(B, L, h * hd)
        x = x + o @ sd[p + ("attention.dense.weight" if llada2 else "self_attn.o_proj.weight")].T
        y = rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        if not c.get("num_experts") or (llada2 and i < c["first_k_dense_replace"]):
            x = x + swiglu(y, sd, p + "mlp.")
        else:
            x = x + (llada2_experts if llada2 else qwen3_experts)(y, sd, p + "mlp.", c)
    return rms(x, sd["model.norm.weight"], eps) @ sd["lm_head.weight"].T


# ---- tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_logits_equal_the_official_forward(models, kind):
    lm = models[kind]
    block = lm.config.block_lengths[0]
    length = 2 * block if block >= 16 else 4 * block
    ids = torch.randint(5, len(lm.tokenizer), (2, length), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        # Block-causal: the model's own forward at its block length.
        got = lm.forward(ids)
        want = official_logits(lm, ids, block_causal_mask(length, block))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # A full attention mask: the same module with bidirectional attention.
        ctx = Context.whole_canvas(ids, lm.config.rotary_dim, lm.config.rope_theta, attention_block=None)
        torch.testing.assert_close(
            lm.model(ids, ctx), official_logits(lm, ids, torch.zeros(length, length)), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("kind", KINDS)
def test_a_cached_block_equals_the_whole_forward(models, kind):
    """The engine's cache modes apply: a block computed against the cache filled by a full
    forward has the full forward's logits (block-causal: earlier blocks never change)."""
    lm = models[kind]
    block = lm.config.block_lengths[0]
    ids = torch.randint(5, len(lm.tokenizer), (1, 3 * block), generator=torch.Generator().manual_seed(3))
    cache = lm.new_cache(1, 3 * block)
    full = lm.forward(ids, cache=cache)
    for mode in ("prefix", "dual"):
        part = lm.forward(ids, cache=cache, mode=FORWARD_MODES[mode](start=block, end=2 * block))
        torch.testing.assert_close(part, full[:, block : 2 * block], atol=1e-5, rtol=1e-5)


def test_the_families_read_their_official_fields(models):
    llada2, sdar, sdar_moe = (models[k].config for k in KINDS)
    assert (llada2.family, llada2.block_causal, llada2.block_lengths, llada2.rotary_dim) == (
        "llada2",
        True,
        (32,),
        4,
    )
    assert llada2.qk_norm and llada2.dense_layers == 1 and llada2.moe.score_function == "sigmoid"
    assert (
        llada2.moe.expert_bias
        and llada2.moe.num_shared_experts == 1
        and llada2.moe.routed_scaling_factor == 2.5
    )
    assert (sdar.family, sdar.block_lengths, sdar.rotary_dim, sdar.moe) == ("sdar", (4,), 8, None)
    assert (
        sdar_moe.moe.score_function == "softmax"
        and sdar_moe.moe.norm_topk_prob
        and not sdar_moe.moe.expert_bias
    )


@pytest.mark.parametrize("kind, turn_end", [("llada2", "<|role_end|>"), ("sdar", "<|im_end|>")])
def test_chat_template_and_special_ids(models, kind, turn_end):
    lm = models[kind]
    tok = lm.tokenizer
    assert tok.convert_ids_to_tokens(lm.config.mask_id) == TOKENS[kind]
    # an answer also ends at the end of its turn
    assert tok.convert_tokens_to_ids(turn_end) in lm.config.eos_ids
    text = tok.decode(lm.encode_chat("is the answer yes"))
    assert text == PROMPTS[kind]


TOKENS = {"llada2": "<|mask|>", "sdar": "<|MASK|>"}
PROMPTS = {
    "llada2": "<role>HUMAN</role>is the answer yes<|role_end|><role>ASSISTANT</role>",
    "sdar": "<|im_start|>user\nis the answer yes<|im_end|>\n<|im_start|>assistant\n",
}


@pytest.mark.parametrize("kind", ("llada2", "sdar-moe"))
def test_a_row_does_not_depend_on_its_batch(models, kind):
    """A left-padded row in a batch has the logits it has alone (blocks laid from its first
    real token; MoE routing is per token)."""
    lm = models[kind]
    g = torch.Generator().manual_seed(5)
    short = torch.randint(5, len(lm.tokenizer), (1, 12), generator=g)
    other = torch.randint(5, len(lm.tokenizer), (1, 16), generator=g)
    batch = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], dim=1), other])
    mask = torch.ones_like(batch)
    mask[0, :4] = 0
    together = lm.forward(batch, mask)
    torch.testing.assert_close(together[:1, 4:], lm.forward(short), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(together[1:], lm.forward(other), atol=1e-5, rtol=1e-5)
