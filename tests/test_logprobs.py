"""Logprobs of committed tokens (decode/logprobs.py): taken at the step that committed each token from the
logits its decoder read, the same tokens as without them, the constraint's mask seen, and the refusals."""

import math

import pytest
import torch

import caidllm
from caidllm.decode.engine import Engine
from caidllm.decode.presets import build_config
from caidllm.errors import InputError

PROMPT = "What is 3 + 4?"


@pytest.fixture(scope="module")
def tiny():
    return caidllm.load("tiny")


def test_logprobs_are_those_of_the_committing_step_and_change_no_token(tiny):
    options = {"method": "vanilla", "gen_length": 32, "block_length": 32}
    (plain,) = tiny.generate([PROMPT], **options)
    (scored,) = tiny.generate([PROMPT], logprobs=True, top_logprobs=3, **options)
    assert scored.token_ids == plain.token_ids and plain.logprobs is None
    assert [e["token_id"] for e in scored.logprobs] == scored.token_ids[: scored.answer_length]
    # The first step's commits: their logprobs are the first forward's (no cache: the prompt and 32 masks).
    prompt = tiny.encode_chat(PROMPT)
    with torch.no_grad():
        logits = tiny.logits(torch.tensor([prompt + [tiny.config.mask_id] * 32]))[0, len(prompt) :].float()
    logits[:, tiny.config.mask_id] = float("-inf")
    expected = torch.log_softmax(logits, dim=-1)
    first = [p for p in range(scored.answer_length) if scored.trace.commit_step[p] == 0]
    assert first
    for p in first:
        entry = scored.logprobs[p]
        assert entry["logprob"] == pytest.approx(float(expected[p, entry["token_id"]]), abs=1e-4)
        assert entry["top_logprobs"][0] == [entry["token_id"], pytest.approx(entry["logprob"])]  # greedy
        values = [v for _, v in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True) and len(values) == 3


def test_under_a_constraint_the_alternatives_are_allowed_tokens_only(tiny):
    (r,) = tiny.generate(
        [PROMPT],
        method="cai",
        gen_length=16,
        block_length=16,
        regex="[0-9]{2}",
        logprobs=True,
        top_logprobs=5,
    )
    digits = {tiny.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)}
    for entry in r.logprobs:
        finite = [t for t, v in entry["top_logprobs"] if math.isfinite(v)]
        assert set(finite) <= digits and entry["token_id"] in digits


def test_bad_logprob_requests_are_refused(tiny):
    with pytest.raises(InputError, match=r"top_logprobs must be an integer in \[0, 20\]"):
        Engine(tiny).submit([3, 4], build_config("vanilla", gen_length=16, block_length=16), logprobs=21)
    with pytest.raises(InputError, match="logprobs: this decoder revises committed tokens"):
        Engine(tiny).submit([3, 4], build_config("wino", gen_length=32, block_length=32), logprobs=0)


def test_logprobs_through_the_openai_client_streamed_and_not(tiny):
    import openai

    from helpers.serve import start

    with start(tiny, max_batch=4, max_queue=16) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        ask = {
            "model": "tiny",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 32,
            "logprobs": True,
            "top_logprobs": 2,
            "extra_body": {"method": "vanilla", "gen_length": 32, "block_length": 32},
        }
        whole = client.chat.completions.create(**ask)
        content = whole.choices[0].logprobs.content
        assert "".join(item.token for item in content) == whole.choices[0].message.content
        assert all(len(item.top_logprobs) == 2 and item.logprob <= 0 for item in content)
        assert len(content) == whole.usage.completion_tokens
        streamed = [
            item
            for chunk in client.chat.completions.create(stream=True, **ask)
            if chunk.choices
            for item in (chunk.choices[0].logprobs.content if chunk.choices[0].logprobs else [])
        ]
        assert [(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in content]
        text = client.completions.create(
            model="tiny",
            prompt="3 + 4 is",
            max_tokens=16,
            logprobs=3,
            extra_body={"gen_length": 16, "block_length": 16},
        )
        lp = text.choices[0].logprobs
        assert "".join(lp.tokens) == text.choices[0].text and all(len(t) == 3 for t in lp.top_logprobs)
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
        for body, param in (
            ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
            ({"top_logprobs": 2}, "top_logprobs"),
            ({"logprobs": "yes"}, "logprobs"),
        ):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": PROMPT}], extra_body=body
                )
            assert refused.value.body["param"] == param
