"""The MoE router's float32 weight (models/moe.py, Router.weight_fp32): LLaDA2's official gate
computes its logits as F.linear(x.float(), weight.float()), converting a bf16 weight on every
forward; caidllm converts it once and again only when the weight changes. The logits are the
official ones exactly, no forward after the first touches the bf16 weight, a changed weight
(in place, load_state_dict, .to) is seen, training still reaches the weight, and the cache is
neither saved nor deep-copied."""

import copy
import io

import pytest
import torch
from torch.overrides import TorchFunctionMode

import caidllm
from caidllm.models.moe import MoEConfig, MoEFeedForward, Router

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


def bf16_router(seed: int = 0) -> Router:
    torch.manual_seed(seed)
    router = Router(MoEConfig(**LLADA2_LIKE))
    with torch.no_grad():
        router.weight.normal_(0, 0.3)
        router.expert_bias.normal_(0, 0.1)
    return router.to(torch.bfloat16)


def official_logits(router: Router, x: torch.Tensor) -> torch.Tensor:
    """LLaDA2MoeGate.forward's logits as shipped: F.linear(hidden_states.type(torch.float32),
    self.weight.type(torch.float32))."""
    return torch.nn.functional.linear(x.type(torch.float32), router.weight.type(torch.float32))


def logits_of(router: Router, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x.float(), router.weight_fp32())


class TensorsFrom(TorchFunctionMode):
    """Records the torch functions that compute a tensor with `tensor` among their arguments
    (a conversion would; reading its dtype, version or address computes none)."""

    def __init__(self, tensor):
        super().__init__()
        self.tensor, self.calls = tensor, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor) and any(
            a is self.tensor for a in (*args, *(kwargs or {}).values())
        ):
            self.calls.append(func)
        return result


def test_a_bf16_router_converts_its_weight_once_and_gives_the_official_logits(monkeypatch):
    router = bf16_router()
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        first = router(x)
        fp32 = router.weight_fp32()
        with TensorsFrom(router.weight) as spy:
            second = router(x)
        assert router.weight_fp32() is fp32 and fp32.dtype == torch.float32
    assert spy.calls == []  # the bf16 weight is not converted (nor used otherwise) after the first forward
    monkeypatch.setattr(Router, "weight_fp32", lambda self: self.weight.float())  # the official way
    with torch.no_grad(), TensorsFrom(router.weight) as spy:
        router(x)
    assert spy.calls == [torch.Tensor.float]  # what the spy sees of a conversion per forward
    assert torch.equal(fp32, router.weight.float())
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    with torch.no_grad():
        assert torch.equal(logits_of(router, x), official_logits(router, x))


@pytest.mark.parametrize("change", ["in place", "load_state_dict", "assign", "to float32 and back"])
def test_a_changed_weight_is_seen(change):
    router, other = bf16_router(0), bf16_router(1)
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        router(x)
        if change == "in place":
            router.weight.copy_(other.weight)
        elif change == "load_state_dict":
            router.load_state_dict(other.state_dict())
        elif change == "assign":
            router.load_state_dict(other.state_dict(), assign=True)
        else:
            router.float()
            router.weight.copy_(other.weight.float())
            router.to(torch.bfloat16)
        assert torch.equal(logits_of(router, x), official_logits(other, x))
        assert torch.equal(router.weight_fp32(), other.weight.float())


def test_a_float32_weight_is_used_as_is_and_training_reaches_the_weight():
    router = bf16_router().float()
    assert router.weight_fp32() is router.weight
    router = bf16_router()
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    logits_of(router, x).sum().backward()  # grad enabled, weight trainable: converted under autograd
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    assert router._fp32 is None


def test_the_cache_is_neither_saved_nor_deep_copied():
    moe = MoEFeedForward(MoEConfig(**LLADA2_LIKE))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    moe = moe.to(torch.bfloat16)
    x = torch.randn(7, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = moe(x)
    assert moe.gate._fp32 is not None
    buffer = io.BytesIO()
    torch.save(moe, buffer)
    buffer.seek(0)
    for twin in (copy.deepcopy(moe), torch.load(buffer, weights_only=False)):
        assert twin.gate._fp32 is None
        with torch.no_grad():
            assert torch.equal(twin(x), expected)


def test_tiny_moe_in_bf16_gives_the_same_logits_as_converting_every_forward(monkeypatch):
    lm = caidllm.load("tiny-moe", device="cpu", dtype="bfloat16")
    ids = torch.tensor([lm.tokenizer.encode("not ( True ) and ( True ) is", add_special_tokens=False)])
    cached = [lm.logits(ids) for _ in range(2)]
    monkeypatch.setattr(Router, "weight_fp32", lambda self: self.weight.float())  # the official way
    every_forward = lm.logits(ids)
    assert torch.equal(cached[0], every_forward) and torch.equal(cached[1], every_forward)


def test_a_copy_made_in_inference_mode_serves_a_later_forward_under_autograd():
    """A frozen router (a fine-tune of the rest) after an evaluation under torch.inference_mode: the
    float32 copy made there must not be an inference tensor, which autograd cannot save."""
    router = bf16_router()
    router.weight.requires_grad_(False)
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    with torch.inference_mode():
        router(x)
    assert not router.weight_fp32().is_inference()
    trained = x.clone().requires_grad_(True)
    _, weights = router(trained)
    weights.sum().backward()
    assert trained.grad is not None and trained.grad.abs().sum() > 0
    with torch.no_grad():
        assert torch.equal(logits_of(router, x), official_logits(router, x))


def test_a_router_made_float32_lets_go_of_its_bf16_copy():
    """After .float() the weight is used as is: the copy of the bf16 weight (and that weight, held with
    it) is released at the next forward, not kept for the life of the model."""
    router = bf16_router()
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        router(x)
        assert router._fp32 is not None
        router.float()
        router(x.float())
    assert router._fp32 is None
