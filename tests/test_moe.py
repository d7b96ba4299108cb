"""The mixture-of-experts layer (models/moe.py): its routing and its output against a
plain per-token re-statement of the official forwards (LLaDA2's gate: sigmoid scores, an
expert bias for the choice only, group-limited top-k over the sum of each group's two
best scores, normalised weights times the routed scaling factor, a shared expert;
LLaDA-MoE / Qwen3-MoE: softmax over all experts, top-k), its parameter names, batch
invariance and bad configurations."""

import pytest
import torch

from caidllm.errors import ModelLoadError
from caidllm.models.moe import MoEConfig, MoEFeedForward, expert_parameter_counts, route

LLADA2_LIKE = dict(
    hidden_size=16,
    moe_intermediate_size=8,
    num_experts=16,
    num_experts_per_tok=4,
    score_function="sigmoid",
    n_group=4,
    topk_group=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    expert_bias=True,
    num_shared_experts=1,
)
# LLaDA-MoE-7B-A1B's routing (softmax top-8 of 64, weights not normalised, no shared expert), small.
LLADA_MOE_LIKE = dict(
    hidden_size=16, moe_intermediate_size=8, num_experts=64, num_experts_per_tok=8, score_function="softmax"
)
# SDAR-30B-A3B / Qwen3-MoE: softmax, top-k weights normalised.
QWEN3_MOE_LIKE = dict(
    hidden_size=16,
    moe_intermediate_size=8,
    num_experts=16,
    num_experts_per_tok=4,
    score_function="softmax",
    norm_topk_prob=True,
)


def random_moe(seed=0, **fields) -> MoEFeedForward:
    torch.manual_seed(seed)
    moe = MoEFeedForward(MoEConfig(**fields))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
        if moe.gate.expert_bias is not None:
            moe.gate.expert_bias.normal_(0, 0.1)
    return moe


def official_gate(x, moe):
    """The official gates re-stated one token at a time."""
    cfg, gate = moe.config, moe.gate
    chosen, weights = [], []
    for token in x:
        logits = gate.weight.float() @ token.float()
        scores = torch.sigmoid(logits) if cfg.score_function == "sigmoid" else torch.softmax(logits, dim=0)
        biased = scores + (gate.expert_bias if gate.expert_bias is not None else 0)
        size = cfg.num_experts // cfg.n_group
        group_score = [
            sorted(biased[g * size : (g + 1) * size].tolist(), reverse=True)[:2] for g in range(cfg.n_group)
        ]
        group_score = torch.tensor([sum(s) for s in group_score])
        groups = set(group_score.topk(cfg.topk_group).indices.tolist()) if cfg.n_group > 1 else {0}
        allowed = torch.tensor([e // size in groups for e in range(cfg.num_experts)])
        top = biased.masked_fill(~allowed, float("-inf")).topk(cfg.num_experts_per_tok).indices
        w = scores[top]
        if cfg.norm_topk_prob:
            w = w / w.sum()
        chosen.append(top)
        weights.append(w * cfg.routed_scaling_factor)
    return torch.stack(chosen), torch.stack(weights)


def official_moe(x, moe):
    """sum over a token's chosen experts of weight * SwiGLU, plus the shared experts."""
    experts, weights = official_gate(x, moe)
    state = moe.state_dict()  # the checkpoint's per-expert tensors
    out = []
    for token, chosen, w in zip(x, experts, weights):
        y = sum(wj * expert_swiglu(state, f"experts.{int(e)}.", token) for e, wj in zip(chosen, w))
        if moe.shared_experts is not None:
            y = y + expert_swiglu(state, "shared_experts.", token)
        out.append(y)
    return torch.stack(out)


def expert_swiglu(state, prefix, token):
    gate = torch.nn.functional.silu(state[prefix + "gate_proj.weight"] @ token)
    return state[prefix + "down_proj.weight"] @ (gate * (state[prefix + "up_proj.weight"] @ token))


@pytest.mark.parametrize(
    "fields", [LLADA2_LIKE, LLADA_MOE_LIKE, QWEN3_MOE_LIKE], ids=["llada2", "llada-moe", "qwen3-moe"]
)
def test_output_equals_the_official_forward_restated(fields):
    moe = random_moe(**fields)
    x = torch.randn(2, 7, fields["hidden_size"])
    with torch.no_grad():
        got = moe(x)
        expected = official_moe(x.view(-1, x.shape[-1]), moe).view_as(x)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fields", [LLADA2_LIKE, LLADA_MOE_LIKE], ids=["llada2", "llada-moe"])
def test_routing_chooses_the_official_experts(fields):
    moe = random_moe(seed=1, **fields)
    x = torch.randn(20, fields["hidden_size"])
    with torch.no_grad():
        experts, weights = moe.gate(x)
        expected_experts, expected_weights = official_gate(x, moe)
    # The same set per token; the weights in the same order as the experts.
    assert torch.equal(experts.sort(dim=1).values, expected_experts.sort(dim=1).values)
    order, expected_order = experts.argsort(dim=1), expected_experts.argsort(dim=1)
    torch.testing.assert_close(weights.gather(1, order), expected_weights.gather(1, expected_order))


def test_expert_bias_steers_the_choice_not_the_weights():
    cfg = MoEConfig(
        **{
            **LLADA2_LIKE,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": False,
        }
    )
    logits = torch.randn(5, cfg.num_experts)
    bias = torch.zeros(cfg.num_experts)
    bias[3] = 10.0  # expert 3 always wins with the bias...
    experts, weights = route(logits, cfg, bias)
    assert (experts == 3).any(dim=1).all()
    # ... but its weight is its own sigmoid score, not the biased one
    at = (experts == 3).float().argmax(dim=1)
    torch.testing.assert_close(weights.gather(1, at[:, None])[:, 0], torch.sigmoid(logits[:, 3]))


def test_group_limited_choice_stays_within_the_best_groups():
    cfg = MoEConfig(**LLADA2_LIKE)
    experts, weights = route(torch.randn(50, cfg.num_experts), cfg)
    groups = experts // (cfg.num_experts // cfg.n_group)
    assert all(len(set(row.tolist())) <= cfg.topk_group for row in groups)
    torch.testing.assert_close(weights.sum(dim=1), torch.full((50,), 2.5))  # normalised, then scaled


def test_a_token_does_not_depend_on_its_batch():
    moe = random_moe(**LLADA2_LIKE)
    x = torch.randn(9, 16)
    with torch.no_grad():
        together = moe(x)
        alone = torch.stack([moe(x[i : i + 1])[0] for i in range(len(x))])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-6)


def test_bfloat16_in_bfloat16_out():
    moe = random_moe(**QWEN3_MOE_LIKE).to(torch.bfloat16)
    with torch.no_grad():
        out = moe(torch.randn(3, 4, 16, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 4, 16) and torch.isfinite(out.float()).all()


def test_parameter_names_are_the_official_ones():
    names = set(random_moe(**LLADA2_LIKE).state_dict())
    assert {
        "gate.weight",
        "gate.expert_bias",
        "experts.0.gate_proj.weight",
        "experts.15.down_proj.weight",
        "shared_experts.up_proj.weight",
    } <= names
    assert len(names) == 2 + 16 * 3 + 3
    plain = set(random_moe(**LLADA_MOE_LIKE).state_dict())
    assert "gate.expert_bias" not in plain and not any(n.startswith("shared_experts") for n in plain)


def test_parameter_counts():
    cfg = MoEConfig(**LLADA2_LIKE)
    total, active = expert_parameter_counts(cfg)
    moe = MoEFeedForward(cfg)
    assert total == sum(p.numel() for p in moe.parameters())
    assert active == 16 * 16 + 3 * 16 * 8 * (4 + 1)
    assert cfg.active_experts == 5


@pytest.mark.parametrize(
    "change, field",
    [
        ({"score_function": "softplus"}, "score_function"),
        ({"num_experts": 15}, "n_group"),
        ({"topk_group": 5}, "topk_group"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
        ({"routed_scaling_factor": float("nan")}, "routed_scaling_factor"),
        ({"num_shared_experts": -1}, "num_shared_experts"),
    ],
)
def test_bad_routing_is_a_clear_error(change, field):
    with pytest.raises(ModelLoadError, match=field):
        MoEConfig(**{**LLADA2_LIKE, **change})


@pytest.fixture(scope="module")
def tiny_moe_layers():
    """The shipped tiny-moe's MoE layers with the hidden states they see on a real prompt and answer."""
    import caidllm

    lm = caidllm.load("tiny-moe", device="cpu")
    layers = [layer for layer in lm.model.model.layers if hasattr(layer.mlp, "experts")]
    seen = []
    hooks = [
        layer.post_attention_layernorm.register_forward_hook(lambda m, a, out: seen.append(out[0]))
        for layer in layers
    ]
    ids = lm.encode_chat("not ( True ) and ( True ) is") + lm.tokenizer.encode(
        "not True and True\n= False and True\n= False\nSo the answer is False.", add_special_tokens=False
    )
    with torch.no_grad():
        lm.model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    return [(layer.mlp, x) for layer, x in zip(layers, seen)]


def test_trained_routing_equals_the_official_forward_on_tiny_moe(tiny_moe_layers):
    """Trained routers on real hidden states (a learnt expert bias, scores far from uniform): the
    layer is the official forward, and the bias and the group limit really change choices there."""
    bias_changes = group_changes = 0
    for moe, x in tiny_moe_layers:
        with torch.no_grad():
            torch.testing.assert_close(moe(x), official_moe(x, moe), atol=1e-4, rtol=1e-4)
            logits = torch.nn.functional.linear(x.float(), moe.gate.weight.float())
            chosen = route(logits, moe.config, moe.gate.expert_bias)[0].sort(dim=1).values
            unbiased = route(logits, moe.config)[0].sort(dim=1).values
            ungrouped = (
                route(
                    logits,
                    MoEConfig(**{**moe.config.__dict__, "n_group": 1, "topk_group": 1}),
                    moe.gate.expert_bias,
                )[0]
                .sort(dim=1)
                .values
            )
        bias_changes += int((chosen != unbiased).any(dim=1).sum())
        group_changes += int((chosen != ungrouped).any(dim=1).sum())
    assert bias_changes > 0 and group_changes > 0
