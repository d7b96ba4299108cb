"""Training tiny-cot: a larger vocabulary started from tiny, few-shot rows, the long canvases."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from caidllm.cli import main as cli_main
from caidllm.errors import InputError
from caidllm.tasks import get_task
from caidllm.train.data import TaskStream
from caidllm.train.fewshot import FewShot, qa_prompt
from caidllm.train.init_weights import VOCAB_TENSORS
from caidllm.train.trainer import TrainConfig, Trainer

ASSETS = Path(__file__).parent.parent / "src" / "caidllm" / "assets"
MIX = ((0, {"tracking_shuffled_objects_three_objects": 1.0, "web_of_lies_cot": 1.0}),)
MICRO = dict(
    d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64, batch_size=8, threads=1, bf16_autocast=False
)


@pytest.fixture(scope="module")
def cot_run(tmp_path_factory):
    """A run of tiny's shape started from tiny with the tiny-cot vocabulary."""
    out = tmp_path_factory.mktemp("cot") / "run"
    return Trainer(
        TrainConfig(
            out_dir=str(out),
            steps=1,
            threads=1,
            init_from="tiny",
            vocabulary="tiny-cot",
            task_phases=MIX,
            canvas_lengths=(128, 256, 384, 512),
        )
    )


def test_a_larger_vocabulary_keeps_tinys_rows_and_starts_new_ones_at_their_mean(cot_run):
    tiny = load_file(str(ASSETS / "tiny" / "model.safetensors"))
    kept = len(json.loads((ASSETS / "tiny" / "tokenizer.json").read_text())["model"]["vocab"])
    state = cot_run.model.state_dict()
    assert cot_run.raw_config["vocab_size"] > tiny[VOCAB_TENSORS[0]].shape[0]
    for key in VOCAB_TENSORS:
        old, new = tiny[key].float(), state[key]
        assert torch.equal(new[:kept], old[:kept])
        assert torch.allclose(new[kept:], old[:kept].mean(dim=0).expand_as(new[kept:]))
    name = "model.transformer.blocks.0.q_proj.weight"
    assert torch.equal(state[name], tiny[name].float())


def test_a_start_whose_tokens_would_move_is_refused(tmp_path):
    start = tmp_path / "start"
    shutil.copytree(ASSETS / "tiny", start)
    data = json.loads((start / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab[300], vocab[301] = vocab[301], vocab[300]
    (start / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="its tokenizer is not a prefix of the run's"):
        Trainer(
            TrainConfig(
                out_dir=str(tmp_path / "run"), steps=1, threads=1, init_from=str(start), vocabulary="tiny-cot"
            )
        )


def test_the_cot_tasks_of_the_mix_are_validated(cot_run):
    """...in place of the families they cover (the same validation questions)."""
    assert cot_run.validated_tasks() == (
        "boolean_expressions",
        "navigate",
        "dyck_languages",
        "multistep_arithmetic_two",
        "arithmetic",
        "tracking_shuffled_objects_three_objects",
        "web_of_lies_cot",
    )


def _stream(trainer: Trainer, fewshot: FewShot | None) -> TaskStream:
    s = trainer.stream
    return TaskStream(
        s.tokenizer, MIX, 8, trainer.cfg.canvas_lengths, s.eot_id, s.eos_id, 0, 0.75, fewshot=fewshot
    )


def _answers(batch):
    return [
        batch.input_ids[r, s:e].tolist() for r, (s, e) in enumerate(zip(batch.answer_start, batch.answer_end))
    ]


def test_fewshot_rows_put_solved_shots_before_the_same_questions(cot_run):
    plain, zero = _stream(cot_run, None), _stream(cot_run, FewShot(share=0.0))
    shots = _stream(cot_run, FewShot(share=1.0, max_shots=3, max_prompt_tokens=512))
    decode = cot_run.tokenizer.decode
    styles, short_shots = set(), 0
    for step in range(4):
        base = plain.batch(step)
        assert torch.equal(base.input_ids, zero.batch(step).input_ids)  # share 0: the batches of before
        batch = shots.batch(step)
        assert batch.task == base.task and _answers(batch) == _answers(base)  # the same questions, answers
        for r in range(len(batch.input_ids)):
            prompt = decode(batch.input_ids[r, : batch.answer_start[r]].tolist())
            alone = decode(base.input_ids[r, : base.answer_start[r]].tolist())  # the question alone
            assert batch.answer_start[r] <= 512
            turns = prompt.count("<|start_header_id|>user")
            if "Q: " in prompt:
                styles.add("qa")
                assert turns == 1 and prompt.rstrip().endswith(
                    "A:<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
                )
            elif turns > 1:
                styles.add("turns")
            elif prompt != alone:  # lm-eval's one-message prefix: shots, then the question as it is
                styles.add("plain")
                question = alone.split("user<|end_header_id|>", 1)[1].lstrip().split("<|eot_id|>")[0]
                content = prompt.split("user<|end_header_id|>", 1)[1].split("<|eot_id|>")[0]
                assert turns == 1 and content.endswith("\n\n" + question)
                assert content[: -len(question)].rstrip().endswith(".")  # the last shot's answer
            short_shots += len(
                re.findall(r"(?:A: |assistant<\|end_header_id\|>\n\n)So the answer is", prompt)
            )
    assert styles == {"qa", "turns", "plain"} and short_shots > 0


def test_fewshot_drops_shots_to_fit_the_prompt_budget(cot_run):
    task = get_task("tracking_shuffled_objects_seven_objects")
    example = task.example(0)
    length = lambda m: len(qa_prompt([], "")) + sum(len(t["content"]) for t in m)  # noqa: E731
    fewshot = FewShot(share=1.0, max_shots=3, max_prompt_tokens=len(example.prompt) + 50)
    for seed in range(5):
        prompt = fewshot.prompt(task, example, fewshot.rng(seed, 0), length)
        assert prompt == example.prompt  # no shot fits beside the question


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--canvas-lengths", "128,x"], "--canvas-lengths: expected integers"),
        (["--canvas-lengths", "128,0"], "canvas_lengths must be integers >= 1"),
        (["--vocabulary", "huge"], "vocabulary must be one of tiny, tiny-cot"),
        (["--fewshot-share", "1.5"], "fewshot_share must be a number in [0, 1]"),
        (["--fewshot-max", "0"], "fewshot_max must be an integer >= 1"),
        (["--task-mix", "tracking_shuffled_objects_nine_objects=1"], "unknown task(s)"),
        (["--task-mix", "navigate_cot=1"], "navigate_cot needs vocabulary 'tiny-cot'"),
    ],
)
def test_train_cli_refuses_bad_cot_options(tmp_path, capsys, flags, message):
    assert cli_main(["train", "--out", str(tmp_path / "run"), "--steps", "1"] + flags) == 2
    assert message in capsys.readouterr().err


def test_a_micro_cot_run_trains_on_long_canvases(tmp_path):
    trainer = Trainer(
        TrainConfig(
            out_dir=str(tmp_path / "run"),
            steps=2,
            vocabulary="tiny-cot",
            task_phases=MIX,
            canvas_lengths=(128, 256, 384, 512),
            fewshot_share=0.5,
            eval_every=10_000,
            **MICRO,
        )
    )
    lengths = [trainer.stream.batch(s).input_ids.shape[1] for s in range(4)]
    step = lengths.index(max(lengths))
    assert lengths[step] > 256
    loss = trainer.loss_on(step)
    loss.backward()
    assert torch.isfinite(loss) and trainer.model.model.transformer.wte.weight.grad.abs().sum() > 0
