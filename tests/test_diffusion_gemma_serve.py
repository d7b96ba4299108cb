"""DiffusionGemma (a small random config) behind `caidllm serve`'s app on 127.0.0.1 and a free port,
through the official `openai` client: its decoders and knobs as request fields, a seeded request's text
the same alone and with others in flight, bad fields refused with a 400 naming them while another request
goes on, streamed canvases in order whose concatenation is the non-streamed text, the draft stream
(provisional)."""

import json
import threading

import httpx
import openai
import pytest

import caidllm
from helpers.serve import start

SMALL = (
    "random:diffusiongemma-26b-a4b?num_hidden_layers=2&vocab_size=512&hidden_size=64&intermediate_size=64"
    "&moe_intermediate_size=32&num_experts=8&top_k_experts=2&head_dim=16&global_head_dim=32"
    "&num_attention_heads=4&num_key_value_heads=2&num_global_key_value_heads=1&canvas_length=16"
    "&image_token_id=500"
)
PROMPT = [5, 9, 3, 77]
KNOBS = {"max_denoising_steps": 4, "entropy_bound": 0.5}


@pytest.fixture(scope="module")
def dg():
    return caidllm.load(SMALL, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def server(dg):
    with start(dg, max_batch=4, max_queue=16) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _complete(client, seed, prompt=PROMPT, max_tokens=40, **extra):
    r = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, seed=seed, extra_body={**KNOBS, **extra}
    )
    return r.choices[0].text, r.model_extra["caidllm"]


def test_info_lists_the_uniform_decoders(server):
    info = httpx.get(f"{server.url}/caidllm/info").json()
    assert info["methods"] == info["uniform_methods"] == ["diffusiongemma", "greedy", "diffusiongemma-cai"]
    assert info["method"] == "diffusiongemma" and info["block_length"] == 16


def test_a_seeded_request_is_the_same_alone_and_with_others_in_flight(client, dg):
    (want,) = dg.generate([PROMPT], method="diffusiongemma", gen_length=40, seed=7, **KNOBS)
    alone, stats = _complete(client, 7)
    assert alone == want.text and stats["nfe"] == want.nfe and stats["method"] == "diffusiongemma"
    others = [
        threading.Thread(
            target=_complete,
            args=(client, s, [11 + s, 4, 200], 64),
            kwargs={"adaptive_stop": False, "max_denoising_steps": 24},
        )
        for s in range(3)
    ]
    for t in others:
        t.start()
    crowded, _ = _complete(client, 7)
    for t in others:
        t.join()
    assert crowded == alone
    greedy, stats = _complete(client, None, method="greedy")
    (want,) = dg.generate([PROMPT], method="greedy", gen_length=40, **KNOBS)
    assert stats["method"] == "greedy" and greedy == want.text
    messages = [{"role": "user", "content": "not ( True ) is"}]
    chat = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=32, seed=2, extra_body=KNOBS
    )
    (want,) = dg.generate(["not ( True ) is"], chat=True, gen_length=32, seed=2, **KNOBS)
    assert chat.choices[0].message.content == want.text


BAD = [
    ({"seed": "7"}, "seed", "integer"),
    ({"seed": 1.5}, "seed", "integer"),
    ({"entropy_bound": 0}, "entropy_bound", "> 0"),
    ({"canvas_length": 8}, "canvas_length", "16"),
    ({"prompt": [5, 500, 3]}, "prompt", "vision tower"),
    ({"method": "cai"}, "method", "mask-based decoder 'cai'"),
    ({"block_length": 16}, "block_length", "uniform-state"),
    ({"threshold": 0.9}, "threshold", "uniform-state"),
    ({"eb_gamma": 0.1}, "eb_gamma", "uniform-state"),
    ({"temperature": 0.5}, "temperature", "t_max"),
    ({"logprobs": 2}, "logprobs", "not implemented"),
    ({"t_min": 0.9, "t_max": 0.5}, "t_max", "greater"),
    ({"stream_draft": "yes"}, "stream_draft", "true or false"),
    ({"max_tokens": 10_000}, "max_tokens", "limit"),
    ({"max_denoising_steps": 100_000_000}, "max_denoising_steps", "this server's limit of 256"),
    ({"method": "diffusiongemma-cai", "dgcai": {"warmup": 2}}, "dgcai.warmup", "[0, 1)"),
    ({"method": "diffusiongemma-cai", "dgcai": {"bogus": 1}}, "dgcai.bogus", "not a setting"),
    ({"dgcai": {"warmup": 0.2}}, "dgcai", "does not apply"),
]


def test_the_cai_variant_is_served_with_its_own_settings(client, dg):
    own = {"warmup": 0.2, "grinding": False}
    (want,) = dg.generate([PROMPT], method="diffusiongemma-cai", gen_length=40, seed=4, dgcai=own, **KNOBS)
    text, stats = _complete(client, 4, method="diffusiongemma-cai", dgcai=own)
    assert stats["method"] == "diffusiongemma-cai" and text == want.text and stats["nfe"] == want.nfe


def test_bad_fields_are_400s_naming_them_and_leave_a_request_in_flight_alone(server, client):
    alone, _ = _complete(client, 3, max_tokens=48)
    result = {}
    flight = threading.Thread(target=lambda: result.update(text=_complete(client, 3, max_tokens=48)[0]))
    flight.start()
    for body, param, words in BAD:
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT, **body}, timeout=60)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], (body, error)
        assert "\n" not in error["message"]
    flight.join()
    assert result["text"] == alone


def _stream(server, **body):
    chunks = []
    with httpx.stream(
        "POST",
        f"{server.url}/v1/completions",
        json={"prompt": PROMPT, "stream": True, **KNOBS, **body},
        timeout=120,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def test_streamed_canvases_in_order_concatenate_to_the_answer(server, client):
    whole, stats = _complete(client, 5, max_tokens=48, adaptive_stop=False)
    chunks = _stream(server, seed=5, max_tokens=48, adaptive_stop=False, commit_events=True)
    events = [e for c in chunks for e in (c.get("caidllm") or {}).get("commit_events", [])]
    canvases = [e["block"] for e in events]
    assert canvases == sorted(canvases) and set(canvases) == {0, 1, 2}  # each finished canvas, in order
    assert [e["position"] for e in events] == list(range(48))
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and stats["steps_per_block"] == [4, 4, 4]


def test_the_draft_stream_shows_each_step(server, client):
    whole, _ = _complete(client, 5, max_tokens=32, adaptive_stop=False)
    chunks = _stream(server, seed=5, max_tokens=32, adaptive_stop=False, stream_draft=True)
    drafts = [c["caidllm"]["draft"] for c in chunks if "draft" in (c.get("caidllm") or {})]
    assert [(d["canvas"], d["step"]) for d in drafts] == [(c, s) for c in (0, 1) for s in (1, 2, 3, 4)]
    for d in drafts:
        assert len(d["tokens"]) == len(d["text"]) == 16 and d["start"] == 16 * d["canvas"]
        assert all(0 <= p < 16 for p in d["accepted"]) and len(d["kept"]) == len(d["accepted"])
    # the last draft of a canvas is the canvas (the argmax), and the text is unchanged by the drafts
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole


def test_the_engine_counters_and_a_uniform_setting_on_a_mask_model(server, tiny):
    from caidllm.serve.protocol import RequestError, ServerDefaults, parse
    from helpers.serve import metric

    assert metric(server.url, "caidllm_forwards_total") > 0
    assert metric(server.url, "caidllm_engine_steps_total") > 0
    for field in ("entropy_bound", "stream_draft"):
        with pytest.raises(RequestError, match="uniform-state decoders") as refused:
            parse({"prompt": "hi", field: True}, "completion", tiny, ServerDefaults(model_name="tiny"))
        assert refused.value.param == field
