"""`caidllm serve` against live servers on 127.0.0.1 (free ports), the tiny model,
through the official `openai` client and raw HTTP."""

import asyncio
import json
import time

import httpx
import openai
import pytest

from caidllm.bench.loadgen import run_load
from helpers.serve import LONG, PROMPT, SETTINGS, metric, start


@pytest.fixture(scope="module")
def server(tiny):
    with start(tiny, max_batch=8, max_queue=64) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_chat_matches_generate_and_stream_matches_whole(client, tiny):
    (want,) = tiny.generate([PROMPT], method="cai", **SETTINGS)
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], extra_body={"method": "cai", **SETTINGS}
    )
    assert r.choices[0].message.content == want.text and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == want.answer_length
    assert r.model_extra["caidllm"]["nfe"] == want.nfe and r.model_extra["caidllm"]["method"] == "cai"
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"method": "cai", **SETTINGS},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert chunks[-1].usage.completion_tokens == want.answer_length and not chunks[-1].choices


def test_completion_raw_prompt_streamed_and_not(client, tiny):
    (want,) = tiny.generate([PROMPT], method="vanilla", chat=False, **SETTINGS)
    r = client.completions.create(model="tiny", prompt=PROMPT, extra_body={"method": "vanilla", **SETTINGS})
    assert r.choices[0].text == want.text
    stream = client.completions.create(
        model="tiny", prompt=PROMPT, stream=True, extra_body={"method": "vanilla", **SETTINGS}
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == want.text


def test_extension_fields_change_the_method(client):
    messages = [{"role": "user", "content": PROMPT}]
    fast = client.chat.completions.create(model="tiny", messages=messages, extra_body={"method": "fastdllm"})
    slow = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=64, extra_body={"method": "vanilla", "block_length": 32}
    )
    assert (
        fast.model_extra["caidllm"]["method"] == "fastdllm"
        and slow.model_extra["caidllm"]["method"] == "vanilla"
    )
    assert slow.model_extra["caidllm"]["nfe"] > fast.model_extra["caidllm"]["nfe"]
    assert (
        slow.model_extra["caidllm"]["gen_length"] == 64 and slow.model_extra["caidllm"]["block_length"] == 32
    )


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"


def test_stop_strings_and_max_tokens(client, tiny):
    (want,) = tiny.generate([PROMPT], method="cai", **SETTINGS)
    messages = [{"role": "user", "content": PROMPT}]
    cut = client.chat.completions.create(
        model="tiny", messages=messages, stop=["\n"], extra_body={"method": "cai", **SETTINGS}
    )
    assert (
        cut.choices[0].message.content == want.text.split("\n")[0] and cut.choices[0].finish_reason == "stop"
    )
    streamed = client.chat.completions.create(
        model="tiny", messages=messages, stop="= False", stream=True, extra_body={"method": "cai", **SETTINGS}
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want.text.split("= False")[0]
    short = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, extra_body={"method": "cai", **SETTINGS}
    )
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 5
    assert short.choices[0].message.content == tiny.decode(want.token_ids[:5])


def test_commit_events_on_request(server):
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "commit_events": True,
        "method": "vanilla",
        **SETTINGS,
    }
    events = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events += json.loads(line[6:]).get("caidllm", {}).get("commit_events", [])
    assert events and {"position", "token", "text", "step", "block", "s_i"} <= set(events[0])
    assert len({e["position"] for e in events}) == len(events)  # each position committed once
    assert all(0 <= e["s_i"] <= 1 and 0 <= e["step"] < 16 for e in events)


@pytest.mark.parametrize(
    "body, status, param, words",
    [
        ({"method": "turbo"}, 400, "method", "unknown method 'turbo'"),
        ({"method": "llada2.2"}, 400, "method", "block-diffusion decoder"),  # InDel on a full-sequence model
        ({"gen_length": 40, "block_length": 16}, 400, "gen_length", "multiple of block_length"),
        ({"n": 2}, 400, "n", "n=2 is not supported"),
        # answered since #44
        (
            {"logprobs": True, "top_logprobs": 21},
            400,
            "top_logprobs",
            "integer in [0, 20]",
        ),
        ({"top_p": 0.5}, 400, "top_p", "not supported"),
        ({"tools": [{"type": "function"}]}, 400, "tools", "tools[0] must be"),  # tools are answered since #44
        ({"messages": []}, 400, "messages", "non-empty list"),
        (
            {"messages": [{"role": "user", "content": "x " * 2000}]},
            400,
            "messages",
            "exceeds the model's context",
        ),
        ({"max_tokens": "ten"}, 400, "max_tokens", "positive integer"),
        ({"temperature": "hot"}, 400, "temperature", "number"),
        ({"stream": "yes"}, 400, "stream", "true or false"),
        ({"max_tokens": 100, "gen_length": 64}, 400, "max_tokens", "exceeds gen_length"),
        ({"frobnicate": 1}, 400, "frobnicate", "unknown field"),
        ({"model": "gpt-4"}, 404, "model", "does not exist"),
    ],
)
def test_bad_requests(server, body, status, param, words):
    payload = {"messages": [{"role": "user", "content": PROMPT}], **body}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=payload, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"]


def test_malformed_json_and_unknown_route(server):
    r = httpx.post(
        f"{server.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert httpx.get(f"{server.url}/v1/nothing").status_code == 404


def test_several_prompts_are_several_choices(client, tiny):
    prompts = [PROMPT, "7 + 5 * 3 ="]
    want = tiny.generate(prompts, method="cai", chat=False, **SETTINGS)
    r = client.completions.create(
        model="tiny", prompt=prompts, user="someone", extra_body={"method": "cai", **SETTINGS}
    )
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [w.text for w in want]
    assert r.usage.completion_tokens == sum(w.answer_length for w in want)
    texts = ["", ""]
    for chunk in client.completions.create(
        model="tiny", prompt=prompts, stream=True, extra_body={"method": "cai", **SETTINGS}
    ):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [w.text for w in want]


def test_stream_options_need_stream(server):
    r = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": PROMPT, "stream_options": {"include_usage": True}}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def test_api_key(tiny):
    with start(tiny, api_key="sekret") as s:
        assert httpx.get(f"{s.url}/health").status_code == 200  # open
        # the live view's page is open too (no secrets in it)
        assert httpx.get(f"{s.url}/").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.get(f"{s.url}/v1/models", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        good = openai.OpenAI(base_url=f"{s.url}/v1", api_key="sekret", max_retries=0)
        assert good.models.list().data[0].id == "tiny"


def test_32_concurrent_requests_all_answered_as_alone(server, tiny):
    from caidllm.bench.arrivals import synthetic_prompts

    prompts = synthetic_prompts(32, seed=1)
    body = {"method": "cai", **SETTINGS}
    result = asyncio.run(run_load(server.url, prompts, concurrency=32, requests=32, body=body, duration=120))
    assert result.errors == {} and len(result.texts) == 32  # zero lost
    alone = tiny.generate(prompts, method="cai", batch_size=1, **SETTINGS)
    for i, want in enumerate(alone):
        assert result.texts[i] == want.text, i


def test_overload_gets_429_and_the_server_recovers(tiny):
    with start(tiny, max_batch=2, max_queue=2) as s:
        body = {"prompt": "7 + 5 * 3 =", "method": "vanilla", "gen_length": 64, "block_length": 16}

        async def burst():
            async with httpx.AsyncClient(timeout=120) as h:
                return await asyncio.gather(
                    *(h.post(f"{s.url}/v1/completions", json=body) for _ in range(12))
                )

        responses = asyncio.run(burst())
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 429}  # every request completed or was told to come back
        for r in responses:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"
            else:
                assert r.json()["choices"][0]["text"]
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 8})
        assert r.status_code == 200 and httpx.get(f"{s.url}/health").json()["status"] == "ok"
        assert metric(s.url, 'caidllm_requests_total{outcome="queue_full"}') == statuses.count(429)


def test_a_request_past_its_time_limit_is_cut(tiny):
    with start(tiny, max_request_time=0.3) as s:
        r = httpx.post(f"{s.url}/v1/completions", json=LONG, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        deadline = time.monotonic() + 10
        while metric(s.url, "caidllm_rows_in_flight") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(s.url, "caidllm_rows_in_flight") == 0  # it left the engine too


def test_disconnect_cancels_the_request(server):
    before = metric(server.url, 'caidllm_requests_total{outcome="cancelled"}')
    body = {**LONG, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        next(r.iter_lines())  # the first chunk came: the request is decoding; drop the connection
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (
            metric(server.url, 'caidllm_requests_total{outcome="cancelled"}') == before + 1
            and metric(server.url, "caidllm_rows_in_flight") == 0
        ):
            break
        time.sleep(0.1)
    assert metric(server.url, 'caidllm_requests_total{outcome="cancelled"}') == before + 1
    assert metric(server.url, "caidllm_rows_in_flight") == 0
