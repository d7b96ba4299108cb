"""LLaDA2.2's block routing (models/moe_block_routing.py): the gate against a re-statement of the
released one (LLaDA2MoeGate.block_routing as docs/llada2.2.md quotes it), the model's logits against a
forward whose MoE layers route that way, the exact block cache against recomputation, batch invariance,
the refusals, and random:llada2.2-flash's parameter counts."""

import pytest
import torch

import caidllm
from caidllm.errors import InputError, ModelLoadError
from caidllm.models.inventory import shape_figures
from caidllm.models.layers import Context, positions_from_mask
from caidllm.models.moe import MoEConfig, MoEFeedForward, route
from caidllm.models.moe_block_routing import context_groups

SMALL = (
    "random:llada2.2-flash?num_hidden_layers=2&hidden_size=32&num_attention_heads=4&num_key_value_heads=2"
    "&head_dim=8&rotary_dim=4&intermediate_size=48&moe_intermediate_size=8&num_experts=16"
    "&num_experts_per_tok=2&block_size=8&max_position_embeddings=256"
)


def small(capacity=4):
    """The same random weights (seed 0) whatever the capacity (it adds no parameter)."""
    return caidllm.load(f"{SMALL}&expert_capacity={capacity}", device="cpu", dtype="float32")


def reference_gate(logits, bias, config):
    """The released gate, re-stated: sigmoid + bias; a block's max picks the pool; top-k inside it;
    bias-free weights, normalised, scaled."""
    scores = torch.sigmoid(logits)
    biased = scores + bias
    blocks = biased.view(-1, config.block_size, config.num_experts)
    pool = blocks.max(dim=1).values.topk(config.expert_capacity, dim=-1).indices
    allowed = torch.zeros(blocks.shape[0], config.num_experts, dtype=torch.bool).scatter_(1, pool, True)
    masked = blocks.masked_fill(~allowed[:, None], float("-inf")).view(-1, config.num_experts)
    experts = masked.topk(config.num_experts_per_tok, dim=-1).indices
    weights = scores.gather(1, experts)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * config.routed_scaling_factor


def test_the_gate_is_the_released_one():
    sizes = dict(hidden_size=8, moe_intermediate_size=4, num_experts=16, num_experts_per_tok=3)
    config = MoEConfig(
        **sizes, score_function="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5, expert_bias=True,
        expert_capacity=5, block_size=4,
    )  # fmt: skip
    torch.manual_seed(1)
    logits, bias = torch.randn(12, 16), 0.1 * torch.randn(16)
    experts, weights = route(logits, config, bias)
    ref_experts, ref_weights = reference_gate(logits, bias, config)
    assert torch.equal(experts, ref_experts)
    torch.testing.assert_close(weights, ref_weights)
    # each block reads at most expert_capacity experts; token routing reads more here
    assert all(experts[i : i + 4].unique().numel() <= 5 for i in range(0, 12, 4))
    token = route(logits, MoEConfig(**{**config.__dict__, "expert_capacity": 0, "block_size": 0}), bias)[0]
    assert max(token[i : i + 4].unique().numel() for i in range(0, 12, 4)) > 5


def reference_moe(layer: MoEFeedForward, x: torch.Tensor, ctx=None) -> torch.Tensor:
    """The released MoE forward over one whole window (batch 1, whole blocks), expert by expert."""
    flat = x.reshape(-1, x.shape[-1])
    logits = torch.nn.functional.linear(flat.float(), layer.gate.weight.float())
    experts, weights = reference_gate(logits, layer.gate.expert_bias, layer.config)
    out = torch.zeros_like(flat, dtype=torch.float32)
    for t in range(flat.shape[0]):
        for e, w in zip(experts[t].tolist(), weights[t]):
            out[t] += w * layer.experts.expert(e, flat[t : t + 1])[0].float()
    out = out.to(x.dtype) + layer.shared_experts(flat)
    return out.view(x.shape)


def test_logits_against_the_released_routing(monkeypatch):
    lm = small()
    ids = torch.randint(0, 1000, (1, 24))
    ours = lm.model(ids)
    monkeypatch.setattr(MoEFeedForward, "forward", reference_moe)
    torch.testing.assert_close(ours, lm.model(ids), rtol=1e-4, atol=1e-4)


def test_block_routing_changes_the_logits():
    ids = torch.randint(0, 1000, (1, 24))
    routed = small(capacity=4).model(ids)
    every = small(capacity=16).model(ids)  # a pool of all experts: token routing
    assert not torch.allclose(routed, every, atol=1e-4)


def test_block_cache_is_exact_and_batch_invariant():
    lm = small()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    cached = lm.generate(prompts, gen_length=24, method="llada2", cache="block")
    recomputed = lm.generate(prompts, gen_length=24, method="llada2", cache="none")
    alone = [lm.generate([p], gen_length=24, method="llada2", cache="block")[0] for p in prompts]
    for c, r, a in zip(cached, recomputed, alone):
        assert c.token_ids == r.token_ids == a.token_ids


def test_part_of_a_block_is_refused():
    mask = torch.ones(1, 16, dtype=torch.bool)
    ctx = Context.build(mask, positions_from_mask(mask), 4, 1e4, index=torch.arange(8, 12)[None])
    with pytest.raises(InputError, match="whole blocks"):
        context_groups(ctx, 8)
    ctx = Context.build(mask, positions_from_mask(mask), 4, 1e4, index=torch.arange(8, 16)[None])
    assert context_groups(ctx, 8).unique().numel() == 1


@pytest.mark.parametrize("capacity", [1, 17])
def test_a_pool_outside_top_k_and_the_experts_is_refused(capacity):
    with pytest.raises(ModelLoadError, match=f"expert_capacity={capacity}") as e:
        small(capacity=capacity)
    assert "\n" not in str(e.value)


def test_random_llada22_flash_counts():
    figures = shape_figures("llada2.2-flash")
    # block routing adds no parameters: LLaDA2.x-flash's counts; the context is 128K
    assert (figures["parameters_total"], figures["parameters_active"]) == (102_889_697_280, 5_508_444_160)
    assert figures["context"] == 131072
