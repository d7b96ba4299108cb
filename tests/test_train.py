"""The trainer on a micro model: loss goes down, runs resume, export loads."""

import json

import pytest
import torch

import caidllm
from caidllm.cli import main as cli_main
from caidllm.train.data import mask_answers
from caidllm.train.trainer import TrainConfig, Trainer

MICRO = dict(d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64, batch_size=8, threads=1,
             bf16_autocast=False, eval_every=10_000, save_every=5, warmup_steps=5, lr=3e-3)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("train_run")


def test_loss_goes_down(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "a"), steps=40, **MICRO))
    with torch.no_grad():
        before = sum(trainer.loss_on(s).item() for s in range(3))
    trainer.train()
    with torch.no_grad():
        after = sum(trainer.loss_on(s).item() for s in range(3))
    assert after < 0.8 * before
    log = [json.loads(line) for line in (run_dir / "a" / "train.log").read_text().splitlines()]
    assert any("loss" in r for r in log)


def test_resume_continues_from_the_checkpoint(run_dir):
    out = str(run_dir / "b")
    first = Trainer(TrainConfig(out_dir=out, steps=10, **MICRO))
    first.train()
    resumed = Trainer(TrainConfig(out_dir=out, steps=12, **MICRO))
    assert resumed.step == 10
    for name, value in first.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name])
    resumed.train()
    assert resumed.step == 12


def test_batches_are_seeded_and_answers_only_are_masked(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    a, b = trainer.stream.batch(3), trainer.stream.batch(3)
    assert torch.equal(a.input_ids, b.input_ids)
    noisy, masked, p_mask, in_answer = mask_answers(a, trainer.special["mask"], torch.Generator().manual_seed(0))
    assert not masked[~in_answer].any()
    assert torch.equal(noisy[~masked], a.input_ids[~masked])
    assert (noisy[masked] == trainer.special["mask"]).all()
    for row, start in zip(a.input_ids, a.answer_start):  # every answer ends with end-of-turn, then EOS
        answer = row[start:].tolist()
        end = answer.index(trainer.special["eot"])
        assert set(answer[end + 1:]) <= {trainer.special["eos"]}


def test_export_loads_like_a_llada_checkpoint_and_generates(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    folder = trainer.export(run_dir / "export")
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["LLaDAModelLM"] and raw["mask_token_id"] == trainer.special["mask"]
    lm = caidllm.load(folder, device="cpu")
    assert lm.config.family == "llada" and lm.dtype == torch.float32
    ids = torch.tensor([lm.encode_chat("not ( True ) and ( True ) is")])
    expected = trainer.as_lm().logits(ids)
    assert torch.allclose(lm.logits(ids), expected, atol=0.05)  # weights stored in bf16
    (result,) = lm.generate(["not ( True ) and ( True ) is"], method="cai", gen_length=32, block_length=16)
    assert lm.config.mask_id not in result.token_ids


def test_train_cli(run_dir, capsys):
    out = str(run_dir / "cli")
    args = ["train", "--out", out, "--steps", "3", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
            "--mlp-hidden-size", "32", "--batch-size", "4", "--threads", "1", "--bf16-autocast", "false"]
    assert cli_main(args) == 0
    assert (run_dir / "cli" / "checkpoint.pt").exists()
    assert cli_main(["train", "--out", out, "--steps", "0"]) == 2
    assert "steps and batch_size must be >= 1" in capsys.readouterr().err
