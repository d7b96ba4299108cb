"""Block-diffusion training (train/block_diffusion.py): the 2L mask, the loss, the
trainer's options, and the plain block decoder it validates with."""

import dataclasses
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from caidllm.cli import main as cli_main
from caidllm.errors import InputError
from caidllm.models.layers import Context, block_visibility
from caidllm.models.llada import LLaDAModel
from caidllm.models.loading import ASSETS
from caidllm.train.bd_decode import block_diffusion_generate
from caidllm.train.block_diffusion import block_diffusion_logits, noise_blocks, training_mask
from caidllm.train.trainer import TrainConfig, Trainer
from helpers.train_runs import MICRO, run_folder

MICRO_FLAGS = [
    "--d-model",
    "32",
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--mlp-hidden-size",
    "32",
    "--batch-size",
    "2",
    "--threads",
    "1",
    "--bf16-autocast",
    "false",
    "--eval-every",
    "100",
]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    torch.manual_seed(0)
    return Trainer(TrainConfig(out_dir=run_folder(tmp_path_factory.mktemp("bd") / "run"), steps=2, **MICRO))


def test_training_mask_of_two_blocks_of_two():
    mask = training_mask(torch.tensor([[0, 0, 1, 1]]))[0].int()
    # rows: noisy 0-3, clean 0-3; columns the same.
    assert mask.tolist() == [
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1],
    ]


def _logits(trainer, noisy, clean, block_length=4):
    trainer.model.eval()
    with torch.no_grad():
        return block_diffusion_logits(trainer.model, noisy, clean, block_length)


def test_a_noisy_block_sees_only_itself_and_the_clean_earlier_blocks(trainer):
    batch = trainer.stream.batch(0)
    clean = batch.input_ids[:1]
    noisy = noise_blocks(batch, 4, trainer.special["mask"], torch.Generator().manual_seed(1))[0][:1]
    block = int(batch.answer_start[0]) // 4 + 1  # a block of the answer with blocks before and after it
    here = slice(4 * block, 4 * block + 4)
    reference = _logits(trainer, noisy, clean)[0, here]

    def other(ids, columns):  # ids with other tokens at `columns`
        changed = ids.clone()
        changed[0, columns] = (changed[0, columns] + 7) % 600 + 10
        return changed

    later, earlier = slice(4 * block + 4, None), slice(0, 4 * block)
    for noisy_in, clean_in in [
        (other(noisy, later), clean),
        (noisy, other(clean, later)),
        (other(noisy, earlier), clean),
    ]:
        assert torch.allclose(_logits(trainer, noisy_in, clean_in)[0, here], reference, atol=1e-5)
    # The clean copy of the earlier blocks is what it reads.
    assert not torch.allclose(_logits(trainer, noisy, other(clean, earlier))[0, here], reference, atol=1e-3)


def test_the_training_copy_computes_what_the_block_causal_model_computes(trainer):
    """Noisy block b beside the clean copy == the plain forward of a block-causal model
    (config.json's caidllm_block_causal, as the export writes it) over [clean blocks < b,
    noisy block b]: what a block decoder runs."""
    batch = trainer.stream.batch(0)
    clean = batch.input_ids[:1]
    noisy = noise_blocks(batch, 4, trainer.special["mask"], torch.Generator().manual_seed(2))[0][:1]
    block = int(batch.answer_start[0]) // 4 + 1
    end = 4 * block + 4
    canvas = torch.cat([clean[:, : 4 * block], noisy[:, 4 * block : end]], dim=1)
    block_causal = LLaDAModel(
        dataclasses.replace(trainer.model_config, block_causal=True, block_lengths=(4,))
    )
    block_causal.load_state_dict(trainer.model.state_dict())
    with torch.no_grad():
        inference = block_causal(canvas)[0, 4 * block :]
    assert torch.allclose(_logits(trainer, noisy, clean)[0, 4 * block : end], inference, atol=1e-5)
    with torch.no_grad():  # and not what the bidirectional model computes
        assert not torch.allclose(trainer.model(canvas)[0, 4 * block :], inference, atol=1e-3)


def test_each_block_has_its_own_mask_ratio_and_only_answers_are_masked(trainer):
    batch = trainer.stream.batch(1)
    noisy, masked, p_mask, in_answer = noise_blocks(
        batch, 8, trainer.special["mask"], torch.Generator().manual_seed(0)
    )
    assert not masked[~in_answer].any()
    assert torch.equal(noisy[masked], torch.full_like(noisy[masked], trainer.special["mask"]))
    per_block = p_mask.view(p_mask.shape[0], -1, 8)
    assert torch.equal(per_block, per_block[:, :, :1].expand_as(per_block))  # constant within a block
    assert per_block[:, :, 0].unique().numel() > 1


def test_training_steps_lower_the_loss_and_the_export_is_block_causal(trainer, tmp_path):
    trainer.model.train()
    losses = []
    for _ in range(10):  # one batch, one noise draw: its loss must fall
        loss = trainer.loss_on(0)
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
    config = json.loads((trainer.export(tmp_path / "m") / "config.json").read_text())
    assert config["caidllm_block_causal"] is True and config["caidllm_block_lengths"] == [4, 8, 16, 32]


def _whole_window_decode(lm, prompt: str, block_length: int, gen_length: int) -> str:
    """The block decoder re-stated without a cache: every step forwards the whole canvas."""
    c = lm.config
    prompt_ids = lm.encode_chat(prompt)
    ids = torch.tensor([prompt_ids + [c.mask_id] * gen_length])
    positions = torch.arange(ids.shape[1])[None]
    ctx_mask = block_visibility(positions, positions, block_length)[:, 0]
    for block in range(len(prompt_ids) // block_length, -(-ids.shape[1] // block_length)):
        columns = torch.arange(block * block_length, min((block + 1) * block_length, ids.shape[1]))
        while bool((ids[0, columns] == c.mask_id).any()):
            ctx = Context.explicit(positions, ctx_mask, c.head_dim, c.rope_theta)
            with torch.no_grad():
                confidence, predicted = lm.model(ids, ctx)[0, columns].softmax(-1).max(-1)
            confidence[ids[0, columns] != c.mask_id] = -1
            best = int(confidence.argmax())
            ids[0, columns[best]] = predicted[best]
        if any(t in c.eos_ids for t in ids[0, len(prompt_ids) : columns[-1] + 1].tolist()):
            break
    answer = ids[0, len(prompt_ids) :].tolist()
    ends = [i for i, t in enumerate(answer) if t in c.eos_ids or t == c.mask_id]
    return lm.decode(answer[: ends[0]] if ends else answer)


def test_the_block_decoder_gives_the_tokens_of_whole_window_recomputation(trainer):
    """Its cache is exact, and a row's answer does not depend on its batch's padding."""
    lm = trainer.as_lm()
    prompts = ["not ( True ) and ( True ) is", "Question: Fidel lies. Does Fidel tell the truth?"]
    cached = block_diffusion_generate(lm, prompts, 4, gen_length=12, batch_size=2)
    assert cached == [_whole_window_decode(lm, p, 4, 12) for p in prompts]


def test_init_from_a_model_starts_from_its_weights(tmp_path):
    started = Trainer(TrainConfig(out_dir=run_folder(tmp_path), steps=1, threads=1, init_from="tiny"))
    name = "model.transformer.blocks.0.q_proj.weight"
    shipped = load_file(str(ASSETS / "tiny" / "model.safetensors"))[name]
    assert torch.equal(started.model.state_dict()[name], shipped.float())


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--objective", "block_diffusion", "--block-lengths", "4,x"], "--block-lengths: expected integers"),
        (
            ["--objective", "block_diffusion", "--block-lengths", "4,0"],
            "block_lengths must be a non-empty tuple",
        ),
        (["--init-from", "/nonexistent/model"], "model folder /nonexistent/model does not exist"),
    ],
)
def test_train_cli_refuses_bad_block_diffusion_options(tmp_path, capsys, flags, message):
    assert cli_main(["train", "--out", str(tmp_path / "run"), "--steps", "1"] + MICRO_FLAGS + flags) == 2
    assert message in capsys.readouterr().err


def test_init_from_a_model_of_another_shape_is_refused(tmp_path):
    with pytest.raises(InputError, match=re.escape("init_from 'tiny': its weights do not fit the model")):
        Trainer(
            TrainConfig(
                out_dir=run_folder(tmp_path), steps=1, threads=1, d_model=32, n_heads=2, init_from="tiny"
            )
        )


def test_config_rejects_an_unknown_objective():
    with pytest.raises(
        InputError, match=re.escape("objective must be one of ('masked', 'block_diffusion', 'uniform')")
    ):
        TrainConfig(objective="bd3lm")
