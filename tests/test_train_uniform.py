"""The uniform objective of `caidllm train` (train/uniform.py, the recipe of tiny-dg): a small
DiffusionGemma-architecture model trained with uniform-state noise, resumed, exported, loaded."""

import json

import pytest
import torch
from safetensors.torch import load_file

import caidllm
from caidllm.errors import InputError
from caidllm.models.diffusion_gemma import DiffusionGemmaModel
from caidllm.models.diffusion_gemma_config import FULL, SLIDING
from caidllm.models.loading import ASSETS
from caidllm.train.trainer import TrainConfig, Trainer
from caidllm.train.uniform import canvas_rows
from helpers.train_runs import MICRO as BD_MICRO
from helpers.train_runs import run_folder

MICRO = dict(
    BD_MICRO,
    n_layers=3,
    save_every=2,
    warmup_steps=2,
    objective="uniform",
    canvas_length=16,
    task_phases=((0, {"boolean_expressions": 1.0, "web_of_lies": 1.0}),),
)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return Trainer(TrainConfig(out_dir=run_folder(tmp_path_factory.mktemp("dg") / "run"), steps=2, **MICRO))


def test_the_model_is_diffusion_gemma_with_both_layer_kinds(trainer):
    assert isinstance(trainer.model, DiffusionGemmaModel)
    assert trainer.model.shape.layer_types == (SLIDING, SLIDING, FULL)
    assert trainer.model.shape.canvas_length == 16 and trainer.model.shape.softcap == 30.0
    assert trainer.model_config.moe.num_experts == 4 and trainer.model_config.moe.num_experts_per_tok == 2


def test_each_row_is_one_canvas_of_its_answer_after_the_earlier_ones(trainer):
    batch = next(b for b in map(trainer.stream.batch, range(20)) if b.task == "web_of_lies")
    eos = trainer.special["eos"]
    seen = set()
    for seed in range(8):
        prompts, canvases = canvas_rows(batch, 16, eos, torch.Generator().manual_seed(seed))
        for r, (prompt, canvas) in enumerate(zip(prompts, canvases)):
            start, end = int(batch.answer_start[r]), int(batch.answer_end[r])
            begin = len(prompt)
            assert (begin - start) % 16 == 0 and start <= begin < end
            assert torch.equal(prompt, batch.input_ids[r, :begin])
            answer = batch.input_ids[r, begin : min(end, begin + 16)]
            assert torch.equal(canvas[: len(answer)], answer)
            assert (canvas[len(answer) :] == eos).all()
            seen.add((begin - start) // 16)
    assert len(seen) > 1  # later canvases are drawn too (web_of_lies' answers span several)


def test_training_steps_lower_the_loss(trainer):
    trainer.model.train()
    losses = []
    for _ in range(12):  # one batch, one noise draw: its loss must fall
        loss = trainer.loss_on(0)
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_a_resumed_run_continues_the_same_run(tmp_path):
    straight = Trainer(TrainConfig(out_dir=run_folder(tmp_path / "a"), steps=4, **MICRO))
    straight.train()
    first = Trainer(TrainConfig(out_dir=run_folder(tmp_path / "b"), steps=2, **MICRO))
    first.train()
    resumed = Trainer(TrainConfig(out_dir=str(tmp_path / "b"), steps=4, **MICRO))
    assert resumed.step == 2
    resumed.train()
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_export_loads_as_diffusion_gemma_and_generates(trainer, tmp_path):
    folder = trainer.export(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DiffusionGemmaForBlockDiffusion"] and config["canvas_length"] == 16
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["max_denoising_steps"] == 48 and trainer.special["eot"] in generation["eos_token_id"]
    lm = caidllm.load(folder)
    assert lm.config.family == "diffusion_gemma"
    ours = {k: v.float() for k, v in trainer.model.state_dict().items()}
    for name, value in lm.model.state_dict().items():
        assert torch.equal(value.float(), ours[name].bfloat16().float()), name
    (result,) = lm.generate(["not ( True ) is"], method="greedy", gen_length=20, seed=0)
    assert 1 <= result.answer_length <= 20 and result.nfe >= 1


def test_init_from_tiny_copies_what_fits(tmp_path):
    cfg = dict(MICRO, d_model=256, n_layers=6, n_heads=4, mlp_hidden_size=768)
    started = Trainer(TrainConfig(out_dir=run_folder(tmp_path), steps=1, init_from="tiny", **cfg))
    shipped = load_file(str(ASSETS / "tiny" / "model.safetensors"))
    state = started.model.state_dict()
    assert torch.equal(
        state["model.decoder.embed_tokens.weight"], shipped["model.transformer.wte.weight"].float()
    )
    sliding, full = (
        "model.decoder.layers.0.self_attn.q_proj.weight",
        "model.decoder.layers.2.self_attn.q_proj.weight",
    )
    assert torch.equal(state[sliding], shipped["model.transformer.blocks.0.q_proj.weight"].float())
    assert state[full].shape != shipped["model.transformer.blocks.2.q_proj.weight"].shape  # wider head: drawn


def test_init_from_an_export_continues_from_all_of_it(trainer, tmp_path):
    folder = trainer.export(tmp_path / "start")
    cfg = dict(MICRO, canvas_length=16)
    continued = Trainer(TrainConfig(out_dir=run_folder(tmp_path), steps=1, init_from=str(folder), **cfg))
    shipped = load_file(str(folder / "model.safetensors"))
    state = continued.model.state_dict()
    assert set(state) == set(shipped)
    for name, value in state.items():
        assert torch.equal(value, shipped[name].to(value.dtype)), name


def test_init_from_an_export_of_another_size_is_refused_naming_a_tensor(trainer, tmp_path):
    folder = trainer.export(tmp_path / "start")
    cfg = dict(MICRO, n_layers=4)
    with pytest.raises(InputError, match="tensor .* (missing|of another shape)"):
        Trainer(TrainConfig(out_dir=run_folder(tmp_path), steps=1, init_from=str(folder), **cfg))


@pytest.mark.parametrize(
    "field, value", [("canvas_length", 0), ("self_conditioning", 1.5), ("objective", "uniformly")]
)
def test_bad_settings_are_refused_naming_the_field(tmp_path, field, value):
    with pytest.raises(InputError, match=field):
        TrainConfig(out_dir=str(tmp_path), **dict(MICRO, **{field: value}))
