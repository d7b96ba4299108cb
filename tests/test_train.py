"""The trainer on a micro model: loss goes down, runs resume, export loads."""

import json
import re

import pytest
import torch
import torch.nn.functional as F

import caidllm
from caidllm.cli import main as cli_main
from caidllm.errors import InputError
from caidllm.train.data import LENGTH_QUANTUM, encode_pair, mask_answers, result_flags
from caidllm.train.trainer import TrainConfig, Trainer

MICRO = dict(
    d_model=32,
    n_layers=2,
    n_heads=2,
    mlp_hidden_size=64,
    batch_size=8,
    threads=1,
    bf16_autocast=False,
    eval_every=10_000,
    save_every=5,
    warmup_steps=5,
    lr=3e-3,
)


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


def test_a_run_whose_last_step_meets_its_time_limit_ends_on_its_validation(run_dir, monkeypatch):
    """The chunked runs (training/run_chunks.sh) stop when the log ends on a validation."""
    cfg = TrainConfig(out_dir=str(run_dir / "limit"), steps=2, time_limit_s=0.0, **MICRO)
    log_path = run_dir / "limit" / "train.log"
    for expected_step in (1, 2):  # step 1: stopped by the limit; step 2: the last, finished
        trainer = Trainer(cfg)
        monkeypatch.setattr(trainer, "validate", lambda: {})
        monkeypatch.setattr(trainer, "fact_accuracy", lambda: 0.0)
        trainer.train()
        assert trainer.step == expected_step
    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert log[-1] == {"step": 2, "facts": 0.0, "validation": {}}
    assert {"event": "time limit reached", "step": 1} in log
    assert {"event": "time limit reached", "step": 2} not in log


def test_batches_are_seeded_and_answers_only_are_masked(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    a, b = trainer.stream.batch(3), trainer.stream.batch(3)
    assert torch.equal(a.input_ids, b.input_ids)
    noisy, masked, p_mask, in_answer = mask_answers(
        a, trainer.special["mask"], torch.Generator().manual_seed(0)
    )
    assert not masked[~in_answer].any()
    assert torch.equal(noisy[~masked], a.input_ids[~masked])
    assert (noisy[masked] == trainer.special["mask"]).all()
    for row, start in zip(a.input_ids, a.answer_start):  # every answer ends with end-of-turn, then EOS
        answer = row[start:].tolist()
        end = answer.index(trainer.special["eot"])
        assert set(answer[end + 1 :]) <= {trainer.special["eos"]}


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
    args = [
        "train",
        "--out",
        out,
        "--steps",
        "3",
        "--d-model",
        "32",
        "--n-layers",
        "1",
        "--n-heads",
        "2",
        "--mlp-hidden-size",
        "32",
        "--batch-size",
        "4",
        "--threads",
        "1",
        "--bf16-autocast",
        "false",
    ]
    assert cli_main(args) == 0
    assert (run_dir / "cli" / "checkpoint.pt").exists()
    final = json.loads((run_dir / "cli" / "train.log").read_text().splitlines()[-1])
    assert final["step"] == 3 and set(final["validation"]) == set(caidllm.tasks.TASK_NAMES)
    assert 0.0 <= final["facts"] <= 1.0
    assert cli_main(["train", "--out", out, "--steps", "0"]) == 2
    assert "steps must be an integer >= 1, got 0" in capsys.readouterr().err
    assert cli_main(["train", "--out", out, "--block-share", "1.5"]) == 2
    assert "block_share must be a number in [0, 1], got 1.5" in capsys.readouterr().err


def test_train_cli_task_mix(run_dir, capsys, monkeypatch):
    out = str(run_dir / "cli-mix")
    args = [
        "train",
        "--out",
        out,
        "--steps",
        "2",
        "--d-model",
        "32",
        "--n-layers",
        "1",
        "--n-heads",
        "2",
        "--mlp-hidden-size",
        "32",
        "--batch-size",
        "4",
        "--threads",
        "1",
        "--bf16-autocast",
        "false",
        "--eval-every",
        "100",
    ]
    tasks = []
    real = mask_answers

    def spy(batch, *args, **kwargs):
        tasks.append(batch.task)
        return real(batch, *args, **kwargs)

    monkeypatch.setattr("caidllm.train.objectives.mask_answers", spy)
    assert cli_main(args + ["--task-mix", "dyck_languages=1"]) == 0
    assert tasks == ["dyck_languages", "dyck_languages"]
    for bad, message in [
        ("dyck_languages", "expected NAME=WEIGHT"),
        ("dyck_languages=x", "expected NAME=WEIGHT"),
        ("=1", "expected NAME=WEIGHT"),
        ("dyck=1", "unknown task(s) ['dyck']"),
        ("navigate=0", "weights at step 0 must be >= 0 with a positive sum"),
    ]:
        assert cli_main(["train", "--out", str(run_dir / "cli-mix-bad"), "--task-mix", bad]) == 2
        assert message in capsys.readouterr().err, bad


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(steps=0), "steps must be an integer >= 1"),
        (dict(batch_size=2.5), "batch_size must be an integer >= 1"),
        (dict(block_length=0), "block_length must be an integer >= 1"),
        (dict(block_share=-0.1), "block_share must be a number in [0, 1]"),
        (dict(cut_share=2), "cut_share must be a number in [0, 1]"),
        (dict(results_from=-1), "results_from must be an integer step >= 0"),
        (dict(results_from=1.5), "results_from must be an integer step >= 0"),
        (dict(tight_canvas_share=float("nan")), "tight_canvas_share must be a number in [0, 1]"),
        (dict(d_model=30, n_heads=4), "d_model (30) must be divisible by n_heads (4)"),
    ],
)
def test_config_rejects_bad_values(bad, message):
    with pytest.raises(InputError, match=re.escape(message)):
        TrainConfig(**bad)


def test_block_rows_look_like_a_block_decoders_input(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    mask_id, block = trainer.special["mask"], 16
    for step in range(6):
        batch = trainer.stream.batch(step)
        generator = torch.Generator().manual_seed(step)
        noisy, masked, p_mask, in_answer = mask_answers(
            batch, mask_id, generator, block_share=1.0, block_length=block
        )
        assert not masked[~in_answer].any()
        for row in range(masked.shape[0]):
            hits = masked[row].nonzero().flatten()
            if len(hits) == 0:
                continue
            first = hits[0].item()
            # The block starts at or before the first masked position, inside the answer
            # (at most at its end-of-turn token); everything past the block is masked.
            assert batch.answer_start[row] <= first
            tail = first + block
            assert masked[row, tail:].all() and (p_mask[row, tail:] == 1).all()
            assert masked[row, batch.answer_end[row] - 1 + block :].all()
        plain = mask_answers(batch, mask_id, generator, block_share=0.0)
        assert (plain[2] == plain[2][:, :1]).all()  # LLaDA rows: one masking probability per row


def test_batches_hold_one_task_and_few_shapes(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    marker = {
        "boolean_expressions": " is<|eot_id|>",
        "web_of_lies": "Does",
        "navigate": "starting point",
        "dyck_languages": "parentheses",
        "multistep_arithmetic_two": ") =",
        "arithmetic": "How",
        "arithmetic_facts": " + ",
    }
    seen = set()
    for step in range(24):
        batch = trainer.stream.batch(step)
        seen.add(batch.task)
        assert batch.input_ids.shape[1] % LENGTH_QUANTUM == 0  # lengths are quantised (few kernel shapes)
        for row, start, end in zip(batch.input_ids, batch.answer_start, batch.answer_end):
            assert marker[batch.task] in trainer.tokenizer.decode(row[:start].tolist())
            assert row[end - 1] == trainer.special["eot"]
    assert "arithmetic_facts" in seen and "boolean_expressions" in seen


def test_the_task_mix_follows_its_phases(run_dir):
    phases = ((0, {"boolean_expressions": 1.0}), (4, {"web_of_lies": 1.0}), (6, {"navigate": 1.0}))
    cfg = TrainConfig(out_dir=str(run_dir / "mix"), steps=12, task_phases=phases, **MICRO)
    stream = Trainer(cfg).stream
    assert [stream.batch(step).task for step in range(8)] == (
        ["boolean_expressions"] * 4 + ["web_of_lies"] * 2 + ["navigate"] * 2
    )


def test_a_new_phase_leaves_earlier_batches_unchanged(run_dir):
    """Appending a phase (with a task the earlier phases never drew) must not
    change a single earlier batch, or a continued recipe would not replay."""
    phases = ((0, {"boolean_expressions": 1.0, "navigate": 2.0}), (5, {"web_of_lies": 1.0, "navigate": 1.0}))
    longer = phases + ((9, {"arithmetic_facts": 1.0}),)
    before = Trainer(TrainConfig(out_dir=str(run_dir / "p1"), steps=12, task_phases=phases, **MICRO)).stream
    after = Trainer(TrainConfig(out_dir=str(run_dir / "p2"), steps=12, task_phases=longer, **MICRO)).stream
    for step in range(9):
        old, new = before.batch(step), after.batch(step)
        assert old.task == new.task and torch.equal(old.input_ids, new.input_ids)
    assert after.batch(9).task == "arithmetic_facts"


@pytest.mark.parametrize(
    "phases, message",
    [
        (((1, {"navigate": 1.0}),), "task_phases must start at step 0"),
        (((0, {"navigate": 1.0}), (5, {"navigate": 1.0}), (5, {"web_of_lies": 1.0})), "in increasing order"),
        (((0, {"navgate": 1.0}),), "unknown task(s) ['navgate'] at step 0"),
        (((0, {"navigate": -1.0}),), "weights at step 0 must be >= 0 with a positive sum"),
        (((0, {"navigate": 0.0}),), "weights at step 0 must be >= 0 with a positive sum"),
        (((0, {"navigate": float("nan")}),), "weights at step 0 must be >= 0 with a positive sum"),
        (((0.0, {"navigate": 1.0}),), "task_phases must start at step 0"),
    ],
)
def test_bad_task_phases_are_refused(phases, message):
    with pytest.raises(InputError, match=re.escape(message)):
        TrainConfig(task_phases=phases)


def test_learning_rate_restarts_keep_the_trained_steps_schedule():
    """A continuation (a restart and more steps) must not change the rate of
    the steps already trained, or the recipe would not replay."""
    first = TrainConfig(steps=300, lr_restarts=())
    continued = TrainConfig(steps=500, lr_restarts=(300,), restart_lr=4e-4)
    assert [continued.lr_at(s) for s in range(300)] == [first.lr_at(s) for s in range(300)]
    assert continued.lr_at(299) == pytest.approx(first.min_lr, rel=1e-3)
    assert continued.lr_at(300) == pytest.approx(4e-4)
    assert continued.lr_at(400) == pytest.approx((4e-4 + 1e-4) / 2)
    assert continued.lr_at(499) == pytest.approx(1e-4, rel=1e-3)
    short = TrainConfig(steps=200, lr_restarts=(300,))  # a restart past the end never happens
    assert short.lr_at(199) == pytest.approx(1e-4, rel=1e-2)
    for restarts in ((300, 300), (0,), (100,), (400, 300)):  # 100: inside the default warm-up
        with pytest.raises(
            InputError, match=re.escape("lr_restarts must be increasing integer steps after the warm-up")
        ):
            TrainConfig(lr_restarts=restarts)


def test_a_fresh_model_memorises_one_batch(run_dir):
    """Regression test for the initialisation: with the 0.02-std init of the 8B
    models this model stalls (loss about 0.7 here after 150 steps); with
    PyTorch's default init it memorises the batch (about 0.006)."""
    torch.manual_seed(0)
    micro = dict(MICRO, d_model=64, n_heads=2, mlp_hidden_size=128)
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "memo"), steps=1, **micro))
    batch = trainer.stream.batch(0)
    in_answer = torch.arange(batch.input_ids.shape[1])[None] >= batch.answer_start[:, None]
    masked = (torch.rand(batch.input_ids.shape, generator=torch.Generator().manual_seed(0)) < 0.3) & in_answer
    noisy = torch.where(masked, torch.full_like(batch.input_ids, trainer.special["mask"]), batch.input_ids)
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(trainer.model(noisy)[masked], batch.input_ids[masked])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.15


def test_result_flags_mark_the_right_hand_sides_of_equations():
    tokens = [
        "1",
        "8",
        " -",
        " ",
        "7",
        ":",
        " ",
        "8",
        " -",
        " ",
        "7",
        " =",
        " ",
        "1",
        ",",
        " ",
        "1",
        "1",
        "\n",
        "=",
        " not",
        " True",
        "\n",
        "So",
        " is",
        " 1",
        "1",
        ".",
    ]
    flagged = [t for t, f in zip(tokens, result_flags(tokens)) if f]
    # spaces, the chain's final "11" and the last line are not results
    assert flagged == [
        "1",
        " not",
        " True",
    ]
    assert result_flags(["7", " +", " ", "5", " =", " ", "1", "2", " =", " ", "3"]) == [False] * 6 + [
        True,
        True,
        False,
        False,
        True,
    ]


def test_result_rows_mask_only_the_results(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    mask_id, checked = trainer.special["mask"], set()
    for step in range(24):
        batch = trainer.stream.batch(step)
        text = trainer.tokenizer.decode(
            batch.input_ids[0, batch.answer_start[0] : batch.answer_end[0]].tolist()
        )
        flagged = trainer.tokenizer.decode(batch.input_ids[0][batch.results[0]].tolist())
        if batch.task == "arithmetic_facts":  # "4 * 8 = 32\n7 + 5 = 12 ..." -> "3212..."
            assert flagged == "".join(
                line.split(" = ")[1] for line in text.replace("<|eot_id|>", "").splitlines()
            )
        if batch.task == "web_of_lies":
            assert not batch.results.any()  # no equations: its rows are masked as usual
        assert not batch.results[
            ~(torch.arange(batch.input_ids.shape[1]) >= batch.answer_start[:, None])
        ].any()
        generator = torch.Generator().manual_seed(step)
        noisy, masked, _, _ = mask_answers(batch, mask_id, generator, block_share=0.5, result_share=1.0)
        has_results = batch.results.any(dim=1)
        assert not (masked & ~batch.results)[has_results].any()
        if has_results.any():
            assert masked[has_results].any()
        if not has_results.all():
            assert masked[~has_results].any()
        checked.add(batch.task)
    assert {"arithmetic_facts", "web_of_lies"} <= checked


class _Predictor(torch.nn.Module):
    """A stand-in model: logits from a plain function of the input ids."""

    def __init__(self, predict):
        super().__init__()
        self.predict = predict

    def forward(self, ids):
        return self.predict(ids)


def test_cut_rows_are_clean_up_to_a_result_and_masked_from_it(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    cuts = set()
    for step in range(24):
        batch = trainer.stream.batch(step)
        generator = torch.Generator().manual_seed(step)
        noisy, masked, p_mask, _ = mask_answers(batch, trainer.special["mask"], generator, cut_share=1.0)
        for row in range(masked.shape[0]):
            if not batch.results[row].any():
                continue
            cut = masked[row].nonzero()[0].item()
            assert batch.results[row, cut] and not batch.results[row, cut - 1]  # the start of a result
            assert masked[row, cut:].all() and (p_mask[row, cut:] == 1).all()  # nothing after it in sight
            assert not masked[row, :cut].any()
            cuts.add((batch.task, cut - batch.answer_start[row].item()))
    assert len(cuts) > 10  # cut at many different results


def _masks_seen(trainer, steps, monkeypatch):
    """{task: (batch, masked)} of the last batch of each task in `steps`."""
    seen = {}
    real = mask_answers

    def spy(batch, *args, **kwargs):
        noisy, masked, p_mask, in_answer = real(batch, *args, **kwargs)
        seen[batch.task] = (batch, masked)
        return noisy, masked, p_mask, in_answer

    monkeypatch.setattr("caidllm.train.objectives.mask_answers", spy)
    for step in steps:
        with torch.no_grad():
            trainer.loss_on(step)
    return seen


def test_drill_rows_mask_only_results_and_chain_rows_are_cut(run_dir, monkeypatch):
    trainer = Trainer(
        TrainConfig(out_dir=str(run_dir / "b"), steps=12, cut_share=1.0, results_from=0, **MICRO)
    )
    seen = _masks_seen(trainer, range(24), monkeypatch)
    batch, masked = seen["arithmetic_facts"]
    assert not (masked & ~batch.results).any()
    batch, masked = seen["arithmetic"]
    assert (masked & ~batch.results).any()  # cut rows mask the tail beyond the result too


def test_no_result_or_cut_rows_before_results_from(run_dir, monkeypatch):
    trainer = Trainer(
        TrainConfig(
            out_dir=str(run_dir / "b"), steps=12, cut_share=1.0, block_share=0.0, results_from=1000, **MICRO
        )
    )
    seen = _masks_seen(trainer, range(24), monkeypatch)
    batch, masked = seen["arithmetic_facts"]
    assert (masked & ~batch.results).any()  # plain rows: operands are masked too
    batch, masked = seen["arithmetic"]
    # a cut row masks everything from its first masked position to the end
    # of the answer; plain rows at rate t leave gaps
    gaps = [
        not masked[row, masked[row].nonzero()[0].item() : batch.answer_end[row]].all()
        for row in range(masked.shape[0])
        if masked[row].any()
    ]
    assert sum(gaps) > len(gaps) // 2


def test_fact_accuracy_scores_the_drill_results(run_dir):
    trainer = Trainer(TrainConfig(out_dir=str(run_dir / "b"), steps=12, **MICRO))
    vocab, mask_id = trainer.raw_config["vocab_size"], trainer.special["mask"]
    clean = []  # the validation drill examples the accuracy is measured on
    for example in caidllm.tasks.get_training_task("arithmetic_facts").examples("validation", 4, seed=0):
        prompt, answer = encode_pair(
            trainer.tokenizer, example.prompt, example.answer, trainer.special["eot"]
        )
        clean.append(torch.tensor(prompt + answer))

    def oracle(ids):  # the clean example that agrees with every unmasked token
        (match,) = [
            c for c in clean if len(c) == ids.shape[1] and ((ids[0] == c) | (ids[0] == mask_id)).all()
        ]
        return F.one_hot(match, vocab)[None].float()

    def first_result_wrong(ids):  # the first masked token of each example is predicted as itself
        logits = oracle(ids)
        logits[0, (ids[0] == mask_id).nonzero()[0].item()] = F.one_hot(torch.tensor(mask_id), vocab).float()
        return logits

    trainer.model = _Predictor(oracle)
    assert trainer.fact_accuracy(4) == 1.0
    trainer.model = _Predictor(first_result_wrong)
    assert trainer.fact_accuracy(4) == round(1 - 4 / 48, 4)  # one fact of twelve wrong in each example
    trainer.model = _Predictor(lambda ids: F.one_hot(ids, vocab).float())  # echoes the masks: all wrong
    assert trainer.fact_accuracy(4) == 0.0
