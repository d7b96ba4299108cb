"""Sparse upcycling of a dense LLaDA-layout model to LLaDA2 MoE (train/upcycle.py), the expert
load balancing of training (train/moe_balance.py) and the trainer on the upcycled model
(the recipe of tiny-moe)."""

import json
import shutil

import pytest
import torch

import caidllm
from caidllm.cli import main as cli_main
from caidllm.errors import InputError
from caidllm.models.loading import ASSETS
from caidllm.models.moe import MoEConfig, MoEFeedForward
from caidllm.train.cli import upcycled_start
from caidllm.train.moe_balance import ExpertBalancer, ExpertCounter
from caidllm.train.trainer import TrainConfig, Trainer
from caidllm.train.upcycle import UpcycleSpec, upcycle

PROMPT = "not ( True ) and ( True ) is"


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    """tiny-bd upcycled without noise: only QK-norm's approximation is left."""
    folder = upcycle(
        "tiny-bd",
        tmp_path_factory.mktemp("up") / "exact",
        UpcycleSpec(noise=0.0, new_dims_std=0.0, calibration_examples=2),
    )
    return caidllm.load(folder, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def source():
    return caidllm.load("tiny-bd", device="cpu", dtype="float32")


def test_the_upcycled_model_is_llada2_moe(exact):
    raw = json.loads((exact.path / "config.json").read_text())
    assert raw["architectures"] == ["LLaDA2MoeModelLM"] and raw["model_type"] == "llada2_moe"
    c = exact.config
    assert (
        c.family == "llada2"
        and c.head_dim == 128
        and c.rotary_dim == 64
        and c.qk_norm
        and c.dense_layers == 1
    )
    assert c.moe.num_experts == 8 and c.moe.num_shared_experts == 3 and c.block_lengths == (4, 8, 16, 32)


def test_each_moe_layer_computes_the_source_ffn_whatever_the_routing(exact, source):
    """Shared expert + scale x (normalised top-k of identical copies) = the dense FFN."""
    x = torch.randn(3, 5, 256)
    for i in range(1, 6):
        block = source.model.model.transformer.blocks[i]
        dense = block.ff_out(torch.nn.functional.silu(block.ff_proj(x)) * block.up_proj(x))
        with torch.no_grad():
            moe = exact.model.model.layers[i].mlp(x)
        torch.testing.assert_close(moe, dense, atol=1e-4, rtol=1e-4)


def test_the_upcycled_model_predicts_what_the_source_predicts(exact, source):
    ids = torch.tensor(
        [
            source.encode_chat(PROMPT)
            + source.tokenizer.encode("not True and True\n= False and True", add_special_tokens=False)
        ]
    )
    with torch.no_grad():
        ours, theirs = exact.model(ids), source.model(ids)
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.95
    # QK-norm's fixed scale is exact only at the calibration's mean |q| and |k|: close, not equal.
    assert (ours.softmax(-1) - theirs.softmax(-1)).abs().max() < 0.3


def test_upcycling_refuses_a_model_that_is_not_dense_llada(tmp_path, exact):
    with pytest.raises(InputError, match="expected a dense LLaDA-layout one"):
        upcycle(str(exact.path), tmp_path / "again")


def test_the_balancer_raises_the_bias_of_idle_experts():
    torch.manual_seed(0)
    cfg = MoEConfig(
        hidden_size=8,
        moe_intermediate_size=4,
        num_experts=4,
        num_experts_per_tok=1,
        score_function="sigmoid",
        expert_bias=True,
    )
    moe = MoEFeedForward(cfg)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
        moe.gate.weight[1:] = 0
        moe.gate.weight[0] = 5.0  # expert 0 takes every token of a positive input
    balancer = ExpertBalancer(moe, rate=0.01)
    moe.train()
    moe(torch.rand(10, 8) + 0.1)
    assert balancer.counts[0].tolist() == [10, 0, 0, 0]
    balancer.update()
    assert moe.gate.expert_bias.tolist() == pytest.approx([-0.01, 0.01, 0.01, 0.01])
    assert balancer.counts[0].sum() == 0
    moe.eval()
    moe(torch.rand(10, 8))  # evaluation forwards are not counted by the balancer
    assert balancer.counts[0].sum() == 0
    counter = ExpertCounter(moe)
    moe(torch.rand(10, 8) + 0.1)
    counter.detach()
    assert sum(counter.shares()[0]) == pytest.approx(1.0)


def test_the_trainer_trains_the_upcycled_model_and_exports_llada2(tmp_path):
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ASSETS / "tiny" / name, run / "tokenizer" / name)
    start = upcycled_start("tiny-bd", run)
    assert upcycled_start("tiny-bd", run) == start  # written once: a resumed run keeps its start
    trainer = Trainer(
        TrainConfig(
            out_dir=str(run),
            init_from=str(start),
            objective="block_diffusion",
            batch_size=2,
            threads=1,
            bf16_autocast=False,
            warmup_steps=1,
            lr=1e-3,
        )
    )
    router = trainer.model.model.layers[1].mlp.gate
    before = router.weight.detach().clone()
    trainer.model.train()
    loss = trainer.loss_on(0)
    loss.backward()
    trainer.optimizer.step()
    trainer.balancer.update()
    assert torch.isfinite(loss) and not torch.equal(router.weight, before)
    assert router.expert_bias.abs().max() == pytest.approx(1e-3)  # one step of the balancing rule
    lm = caidllm.load(trainer.export(tmp_path / "export"), device="cpu")
    assert lm.config.family == "llada2" and lm.config.block_lengths == (4, 8, 16, 32)
    assert lm.model.model.layers[1].mlp.gate.expert_bias.dtype == torch.float32  # kept fp32 in the file


def test_cli_refuses_two_starts(tmp_path, capsys):
    code = cli_main(
        ["train", "--out", str(tmp_path / "run"), "--upcycle-from", "tiny-bd", "--init-from", "tiny"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--upcycle-from and --init-from" in err and len(err.splitlines()) == 1
