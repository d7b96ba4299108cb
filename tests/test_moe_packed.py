"""Experts packed for oneDNN (models/moe_packed.py, the ``packed`` kernel): auto packs bf16 experts
on a CPU at load and nothing else; the packed experts give the loop's outputs (fp32 to 1e-5: the
fp32 parity, tokens and batch invariance also run in test_moe_kernels.py's kernel lists), replace
the stacks (same bytes), and leave as the dense form (state_dict, pickling, deepcopy, .to);
quantization unpacks them first; every wrong use is refused naming the problem."""

import copy
import io
import json

import pytest
import torch
from test_moe import LLADA2_LIKE, random_moe
from test_moe_kernels import RANDOM

import caidllm
from caidllm.errors import InputError
from caidllm.models.moe import MoEFeedForward, set_moe_kernel
from caidllm.models.moe_experts import ExpertList, StackedExperts
from caidllm.models.moe_kernels import pick_kernel, run_experts
from caidllm.models.moe_packed import PackedExperts, onednn_packs

pytestmark = pytest.mark.skipif(not onednn_packs(torch.bfloat16), reason="no oneDNN bf16 on this CPU / torch")


def moe_layers(lm):
    return [m for m in lm.model.modules() if isinstance(m, MoEFeedForward)]


def ids():
    return torch.randint(0, 500, (2, 20), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", RANDOM)
def test_auto_packs_bf16_experts_on_a_cpu_and_gives_the_loops_logits(family):
    reference = caidllm.load(RANDOM[family], device="cpu", dtype="bfloat16", moe_kernel="loop")
    lm = caidllm.load(RANDOM[family], device="cpu", dtype="bfloat16")
    assert all(isinstance(m.experts, StackedExperts) for m in moe_layers(reference))
    assert all(isinstance(m.experts, PackedExperts) for m in moe_layers(lm))
    assert pick_kernel(moe_layers(lm)[0].experts, torch.zeros(4, 64, dtype=torch.bfloat16)) == "packed"
    with torch.no_grad():  # bf16: oneDNN's rounding (SiLU in fp32 before the product) differs from torch's
        torch.testing.assert_close(lm.logits(ids()).float(), reference.logits(ids()).float(), atol=0.1, rtol=0.05)
    block = {"llada2": 32, "llada-moe": 16, "sdar-moe": 4}[family]
    assert lm.generate(["hello"], method="fastdllm", gen_length=32, block_length=block)[0].nfe > 0


def test_fp32_compile_and_other_kernels_keep_the_stacks():
    lm = caidllm.load(RANDOM["llada2"], device="cpu", dtype="float32")
    assert all(isinstance(m.experts, StackedExperts) for m in moe_layers(lm))  # fp32 packed: no faster
    bf16 = caidllm.load(RANDOM["llada2"], device="cpu", dtype="bfloat16", moe_kernel="grouped")
    assert all(isinstance(m.experts, StackedExperts) for m in moe_layers(bf16))
    set_moe_kernel(bf16.model, "auto", pack=False)  # what load(compile=True) asks
    assert all(isinstance(m.experts, StackedExperts) for m in moe_layers(bf16))
    set_moe_kernel(lm.model, "packed")  # asked for: fp32 packs too
    assert all(isinstance(m.experts, PackedExperts) and m.experts.dtype == torch.float32 for m in moe_layers(lm))


def test_packing_and_unpacking_keep_the_weights_and_their_bytes():
    from caidllm.models.quantize import weights_bytes

    lm = caidllm.load(RANDOM["llada2"], device="cpu", dtype="bfloat16", moe_kernel="grouped")
    state = {k: v.clone() for k, v in lm.model.state_dict().items()}
    before = weights_bytes(lm.model)
    set_moe_kernel(lm.model, "auto")
    assert isinstance(moe_layers(lm)[0].experts, PackedExperts)
    assert weights_bytes(lm.model) == before  # replaced, not kept beside the stacks
    packed_state = lm.model.state_dict()
    assert packed_state.keys() == state.keys() and all(torch.equal(packed_state[k], state[k]) for k in state)
    set_moe_kernel(lm.model, "grouped")
    experts = moe_layers(lm)[0].experts
    assert isinstance(experts, StackedExperts)
    name = next(k for k in state if k.endswith("mlp.experts.3.up_proj.weight"))
    assert torch.equal(experts.up_proj[3], state[name])


def test_packed_experts_save_deepcopy_load_and_move():
    lm = caidllm.load(RANDOM["llada-moe"], device="cpu", dtype="bfloat16")
    with torch.no_grad():
        expected = lm.logits(ids())
        buffer = io.BytesIO()
        torch.save(lm.model, buffer)
        buffer.seek(0)
        for model in (torch.load(buffer, weights_only=False), copy.deepcopy(lm.model)):
            assert isinstance(moe_layers(type("LM", (), {"model": model}))[0].experts, PackedExperts)
            lm_copy = copy.copy(lm)
            lm_copy.model = model
            assert torch.equal(lm_copy.logits(ids()), expected)
        other = caidllm.load(RANDOM["llada-moe"], device="cpu", dtype="bfloat16")
        layer, source = moe_layers(other)[0], moe_layers(lm)[0]
        layer.experts.load_state_dict({k: torch.zeros_like(v) for k, v in source.experts.state_dict().items()})
        assert all(not p.to_dense().any() for p in layer.experts.parameters())
    experts = source.experts.float()  # .to(dtype) repacks in the new dtype
    assert experts.dtype == torch.float32 and isinstance(experts, PackedExperts)
    with pytest.raises(InputError, match="packed experts run on a CPU in float32 or bfloat16.*on meta"):
        source.experts.to("meta")


def test_quantizing_packed_experts_unpacks_them_first():
    pytest.importorskip("torchao")
    from caidllm.models.quantize import quantize_loaded

    lm = caidllm.load(RANDOM["llada2"], device="cpu", dtype="bfloat16")
    assert isinstance(moe_layers(lm)[0].experts, PackedExperts)
    quantize_loaded(lm, "int8")
    assert all(isinstance(m.experts, ExpertList) for m in moe_layers(lm))
    assert torch.isfinite(lm.logits(torch.tensor([[1, 2, 3]])).float()).all()
    with pytest.raises(InputError, match="moe_kernel 'packed' runs packed full-precision experts"):
        caidllm.load(RANDOM["llada2"], device="cpu", quantize="int8", moe_kernel="packed")


def test_the_command_line_refuses_packed_with_quantize(capsys):
    pytest.importorskip("torchao")
    from caidllm.cli import main

    argv = ["generate", "hi", "--model", RANDOM["llada2"], "--device", "cpu", "--gen-length", "32",
            "--block-length", "32", "--json"]
    assert main([*argv, "--moe-kernel", "packed"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"]
    assert main([*argv, "--moe-kernel", "packed", "--quantize", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("caidllm: error: moe_kernel 'packed' runs packed full-precision")


def test_wrong_uses_are_refused_naming_the_problem():
    moe = random_moe(**LLADA2_LIKE).to(torch.float16)
    with pytest.raises(InputError, match="moe_kernel 'packed' runs experts packed for oneDNN on a CPU in float32 "
                                         "or bfloat16; these are torch.float16 on cpu"):
        set_moe_kernel(moe, "packed")
    moe = random_moe(**LLADA2_LIKE)
    x, chosen, weights = torch.randn(3, 16), torch.zeros(3, 4, dtype=torch.long), torch.ones(3, 4)
    with pytest.raises(InputError, match="moe_kernel 'packed' cannot run experts not packed"):
        run_experts(moe.experts, "packed", x, chosen, weights)
    set_moe_kernel(moe, "packed")
    with pytest.raises(InputError, match="moe_kernel 'grouped' cannot run experts packed for oneDNN"):
        run_experts(moe.experts, "grouped", x, chosen, weights)
    with pytest.raises(InputError, match="packed experts run inference only"):
        moe(x.requires_grad_())


def test_expert_parallel_shards_packed_experts():
    from caidllm.parallel.experts import shard_experts
    from caidllm.parallel.mesh import TPGroup

    moe = random_moe(**LLADA2_LIKE).to(torch.bfloat16)
    stacks = {n: getattr(moe.experts, n).detach().clone() for n in ("gate_proj", "up_proj", "down_proj")}
    set_moe_kernel(moe, "auto")
    shard_experts(moe, moe.config, TPGroup(rank=1, size=2))
    assert isinstance(moe.experts, PackedExperts) and moe.experts.num_experts == 8
    for name, stack in moe.experts.stacks().items():
        assert torch.equal(stack, stacks[name][8:])
