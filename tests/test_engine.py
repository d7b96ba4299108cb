"""The decode engine on tiny random LLaDA / Dream checkpoints."""

import json

import pytest
import torch

from caidllm.cli import main as cli_main
from caidllm.decode import build_config, method_names
from caidllm.errors import InputError
from helpers.decoding import BLOCK, GEN, PROMPTS, block_of, run


@pytest.mark.parametrize("method", method_names(block_causal=False))
def test_every_preset_runs_and_never_leaves_a_mask(lm, method):
    if method in ("wino", "dkv", "dkv-greedy") and lm.config.family == "dream":
        pytest.skip("refused on Dream (tests/test_decoders.py, tests/test_dkv.py)")
    results = run(lm, PROMPTS, method)
    assert len(results) == len(PROMPTS)
    for r in results:
        assert len(r.token_ids) == GEN
        assert lm.config.mask_id not in r.token_ids
        block = build_config(
            method, gen_length=GEN, block_length=block_of(method)
        ).block_length  # elastic: GEN
        assert all(0 <= s < block for s in r.trace.commit_step_in_block)
        assert len(r.steps_per_block) == GEN // block
        assert r.nfe == sum(r.steps_per_block)
        assert all(c is not None and 0 < c <= 1 for c in r.trace.first_confidence)


def test_vanilla_commits_one_token_per_step(lm):
    (r,) = run(lm, PROMPTS[:1], "vanilla")
    assert r.nfe == GEN and r.steps_per_block == [BLOCK] * (GEN // BLOCK)
    for b in range(GEN // BLOCK):
        local = r.trace.commit_step_in_block[b * BLOCK : (b + 1) * BLOCK]
        assert sorted(local) == list(range(BLOCK))
    assert sorted(r.trace.commit_step) == list(range(GEN))


def test_vanilla_with_fewer_steps_commits_several_per_step(lm):
    (r,) = run(lm, PROMPTS[:1], "vanilla", steps=GEN // 2)
    assert r.steps_per_block == [BLOCK // 2] * (GEN // BLOCK)
    assert all(r.trace.commit_step_in_block.count(t) == 2 * (GEN // BLOCK) for t in range(BLOCK // 2))


def test_threshold_one_is_one_token_per_step(lm):
    vanilla = run(lm, PROMPTS, "vanilla")
    strict = run(lm, PROMPTS, "fastdllm", threshold=1.0, cache="none")
    for a, b in zip(vanilla, strict):
        assert a.token_ids == b.token_ids and a.nfe == b.nfe == GEN


def test_cache_modes_agree_right_after_a_refresh(lm):
    # Refreshing at every step makes every step "the first after a refresh": all modes agree.
    outputs = [
        run(lm, PROMPTS, "fastdllm", cache=c, refresh_every=1, threshold=0.3)
        for c in ("none", "prefix", "dual")
    ]
    for none, prefix, dual in zip(*outputs):
        assert none.token_ids == prefix.token_ids == dual.token_ids
    # With the default cadence only the block's first step is a refresh: first-block s_i agree.
    outputs = [run(lm, PROMPTS, "cai", cache=c) for c in ("none", "prefix", "dual")]
    for none, prefix, dual in zip(*outputs):
        assert none.trace.first_confidence[:BLOCK] == pytest.approx(
            prefix.trace.first_confidence[:BLOCK], abs=1e-5
        )
        assert none.trace.first_confidence[:BLOCK] == pytest.approx(
            dual.trace.first_confidence[:BLOCK], abs=1e-5
        )


@pytest.mark.parametrize("method", ["vanilla", "fastdllm", "fastdllm-prefix", "cai", "cai-gate-on"])
def test_batch_invariance(lm, method):
    together = run(lm, PROMPTS, method, threshold=0.2, batch_size=4)
    for prompt, joint in zip(PROMPTS, together):
        (alone,) = run(lm, [prompt], method, threshold=0.2)
        assert alone.token_ids == joint.token_ids
        assert alone.nfe == joint.nfe and alone.steps_per_block == joint.steps_per_block
        assert alone.trace.commit_step == joint.trace.commit_step


def test_sampling_is_seeded_and_batch_invariant(lm):
    a = run(lm, PROMPTS, "fastdllm", temperature=1.0, seed=7)
    b = run(lm, PROMPTS, "fastdllm", temperature=1.0, seed=7)
    c = run(lm, PROMPTS, "fastdllm", temperature=1.0, seed=8)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    (alone,) = run(lm, [PROMPTS[2]], "fastdllm", temperature=1.0, seed=7)
    assert alone.token_ids == a[2].token_ids
    greedy = run(lm, PROMPTS, "fastdllm")
    assert [r.token_ids for r in a] != [r.token_ids for r in greedy]


class EndsEarly:
    """Wraps a model so that EOS wins every generated position from `after` on."""

    def __init__(self, lm, prompt_length, after):
        self.lm, self.prompt_length, self.after = lm, prompt_length, after

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def forward(self, input_ids, attention_mask=None, cache=None, mode=None):
        logits = self.lm.forward(input_ids, attention_mask, cache, mode)
        (start,) = mode.start  # the engine passes one start per row; one prompt here
        first = start - self.prompt_length
        for i in range(logits.shape[1]):
            if first + i >= self.after:
                logits[:, i, self.lm.config.eos_id] = 50.0
        return logits

    def generate(self, prompts, method, **kw):
        from caidllm.decode import generate

        return generate(self, prompts, method=method, **kw)


def test_early_stop_fills_with_eos_and_saves_steps(llada_lm):
    prompt = PROMPTS[0]
    lm = EndsEarly(llada_lm, len(prompt), after=3)
    full = run(lm, [prompt], "vanilla", gen_length=32, early_stop=False)[0]
    short = run(lm, [prompt], "vanilla", gen_length=32, early_stop=True)[0]
    assert short.early_stopped and not full.early_stopped
    assert short.text == full.text and short.answer_length == full.answer_length == 3
    assert short.nfe < full.nfe and short.nfe <= BLOCK
    eos = llada_lm.config.eos_id
    assert short.token_ids[3:] == [eos] * (32 - 3)
    assert short.trace.first_confidence[BLOCK:] == [None] * (32 - BLOCK)  # later blocks never ran
    assert short.steps_per_block[1:] == [0] * 3


def test_string_prompts_use_the_chat_template(llada_lm):
    (r,) = llada_lm.generate(["hello there"], method="cai", gen_length=GEN, block_length=BLOCK)
    assert r.prompt_length == len(llada_lm.encode_chat("hello there"))
    (raw,) = llada_lm.generate(["hello there"], method="cai", gen_length=GEN, block_length=BLOCK, chat=False)
    assert raw.prompt_length < r.prompt_length


@pytest.mark.parametrize(
    "prompts, kwargs, message",
    [
        (["a", [1, 2]], {}, "must not mix strings and token-id lists"),
        ([""], {}, "prompt 0 is empty"),
        ([], {}, "non-empty list"),
        ([[1, 2, 100000]], {}, "token id 100000 outside the vocabulary"),
        ([[1, 2]], dict(gen_length=4096), "exceeds the model's context"),
        ([[1, 2]], dict(batch_size=0), "batch_size must be a positive integer"),
        ([[1, 2]], dict(method="turbo"), "unknown method 'turbo'"),
        ([[1, 2]], dict(cache="triple"), "unknown cache mode"),
        ([[1, 2]], dict(gen_length=12, block_length=8), "multiple of block_length"),
        ([[1, 2]], dict(threshold=1.2), r"threshold must be in \(0, 1\]"),
        ([[1, 2]], dict(steps=0), "steps must be a positive integer"),
        ([[1, 2], 3], {}, "each prompt must be a string or a list of token ids"),
    ],
)
def test_bad_input(llada_lm, prompts, kwargs, message):
    kwargs = {"gen_length": GEN, "block_length": BLOCK, **kwargs}
    with pytest.raises(InputError, match=message):
        llada_lm.generate(prompts, **kwargs)


def test_cli_generate_json(llada_dir, capsys):
    code = cli_main(
        [
            "generate",
            "hello",
            "two words",
            "--model",
            str(llada_dir),
            "--method",
            "fastdllm",
            "--gen-length",
            "16",
            "--block-length",
            "8",
            "--json",
            "--device",
            "cpu",
            "--dtype",
            "float32",
        ]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    record = json.loads(lines[0])
    for key in ("text", "token_ids", "nfe", "steps_per_block", "elapsed_s", "trace", "method"):
        assert key in record
    assert record["method"] == "fastdllm" and len(record["token_ids"]) == 16


def test_cli_generate_text_and_errors(llada_dir, capsys):
    assert (
        cli_main(
            [
                "generate",
                "hello",
                "--model",
                str(llada_dir),
                "--gen-length",
                "16",
                "--block-length",
                "8",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "forward passes" in capsys.readouterr().out
    assert cli_main(["generate", "hello", "--model", str(llada_dir), "--method", "turbo"]) == 2
    assert "unknown method 'turbo'" in capsys.readouterr().err
    assert cli_main(["generate", "hello", "--model", "/nonexistent/model"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_early_stop_trace_marks_filled_positions_as_never_committed(llada_lm):
    prompt = PROMPTS[0]
    lm = EndsEarly(llada_lm, len(prompt), after=3)
    short = run(lm, [prompt], "vanilla", gen_length=32, early_stop=True)[0]
    full = run(lm, [prompt], "vanilla", gen_length=32, early_stop=False)[0]
    steps = short.trace.commit_step
    # Blocks after the end were filled, never committed.
    assert steps[BLOCK:] == [-1] * (32 - BLOCK) and short.trace.commit_step_in_block[BLOCK:] == [-1] * (
        32 - BLOCK
    )
    # The end token's block ran to its end here (vanilla commits the confident EOS positions first):
    # those committed positions keep the step they were committed at, as without early stop.
    assert steps[:BLOCK] == full.trace.commit_step[:BLOCK] and all(s >= 0 for s in steps[:BLOCK])
    assert sorted(steps[:BLOCK]) == list(range(BLOCK))  # one commit per step, each at its own step


def test_sampling_without_a_seed_leaves_torchs_global_rng_alone(llada_lm):
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    a = run(llada_lm, PROMPTS[:2], "fastdllm", temperature=1.0, seed=None)
    b = run(llada_lm, PROMPTS[:2], "fastdllm", temperature=1.0, seed=None)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.initial_seed() == 1234
    assert [r.token_ids for r in a] != [r.token_ids for r in b]  # each run draws its own seed


def test_predict_leaves_the_callers_logits_unchanged(llada_lm):
    from caidllm.decode.sampling import predict

    mask_id = llada_lm.config.mask_id
    logits = torch.randn(2, 5, 64)
    logits[..., mask_id] = 100.0  # the mask would win if it were not excluded
    before = logits.clone()
    for temperature, gens in ((0.0, None), (1.0, [torch.Generator().manual_seed(i) for i in range(2)])):
        predicted, confidence = predict(logits, mask_id, temperature, gens)
        assert torch.equal(logits, before)
        assert not (predicted == mask_id).any() and ((confidence > 0) & (confidence <= 1)).all()
    bf16 = before.bfloat16()
    predict(bf16, mask_id, 0.0, None)
    assert torch.equal(bf16, before.bfloat16())


def test_predict_matches_torch_logsumexp_and_consuming_changes_nothing_else():
    from caidllm.decode.sampling import predict

    logits = torch.randn(3, 7, 500) * 4
    logits[0, 0, :5] = 9.0  # a tie: the first index wins, as argmax
    reference = logits.clone()
    reference[..., 2] = float("-inf")
    want_tokens = reference.argmax(-1)
    want = torch.exp(
        reference.gather(-1, want_tokens[..., None]).squeeze(-1) - torch.logsumexp(reference, -1)
    )
    for consume in (False, True):
        tokens, confidence = predict(logits.clone(), 2, 0.0, None, consume=consume)
        assert torch.equal(tokens, want_tokens) and torch.equal(confidence, want)  # to the last bit
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(3)]  # noqa: E731
    sampled = predict(logits.clone(), 2, 0.8, gens())
    assert all(
        torch.equal(a, b) for a, b in zip(sampled, predict(logits.clone(), 2, 0.8, gens(), consume=True))
    )


def test_empty_token_id_prompt_is_named(llada_lm):
    with pytest.raises(InputError, match="prompt 0 is an empty list of token ids"):
        llada_lm.generate([[]], gen_length=GEN, block_length=BLOCK)
    with pytest.raises(InputError, match="prompt 1 is an empty list of token ids"):
        llada_lm.generate([[1, 2], []], gen_length=GEN, block_length=BLOCK)


def test_cli_generate_checks_the_method_before_loading_the_model(monkeypatch, capsys):
    import caidllm.models

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the method was checked")

    monkeypatch.setattr(caidllm.models, "load", must_not_load)
    assert cli_main(["generate", "hello", "--method", "turbo"]) == 2
    assert "unknown method 'turbo'" in capsys.readouterr().err
    assert cli_main(["generate", "hello", "--gen-length", "12", "--block-length", "8"]) == 2
    assert "multiple of block_length" in capsys.readouterr().err
