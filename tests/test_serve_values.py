"""Every accepted value honoured, or refused (issue 36, part 3), as the real `openai` client meets a
live server on 127.0.0.1: JSON `true` is not 1, the OpenAI ranges hold, a setting the model or the
method does not read is refused naming it and why, a refusal's advice then works, and an error raised
when the request reaches the engine names its own field."""

import httpx
import openai
import pytest

import caidllm
from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults
from helpers.serve import PROMPT, start

FAST = {"method": "fastdllm", "gen_length": 16, "block_length": 16}


@pytest.fixture(scope="module")
def server(tiny):
    with start(tiny) as s:
        yield s


@pytest.fixture(scope="module")
def bd_server():
    lm = caidllm.load("tiny-bd", device="cpu", dtype="float32")
    defaults = ServerDefaults(
        model_name="tiny-bd", gen_length=16, block_length=lm.config.block_lengths[0], max_gen_length=256
    )
    with LocalServer(create_app(lm, ServerConfig(defaults=defaults))) as s:
        yield s


def client(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=60)


def refused_by(s, param: str, chat: bool = False, **fields) -> str:
    with pytest.raises(openai.BadRequestError) as refused:
        if chat:
            client(s).chat.completions.create(
                model=s.model, messages=[{"role": "user", "content": PROMPT}], max_tokens=4, **fields
            )
        else:
            client(s).completions.create(model=s.model, prompt=PROMPT, max_tokens=4, **fields)
    error = refused.value.body
    assert refused.value.status_code == 400 and error["param"] == param, error
    return error["message"]


@pytest.fixture(autouse=True)
def _model_names(server, bd_server):
    server.model, bd_server.model = "tiny", "tiny-bd"


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("top_p", 2, "in (0, 1]"),
        ("top_p", 1.0000001, "in (0, 1]"),
        ("top_p", 0.5, "not supported"),
        ("n", True, "integer"),
        ("best_of", True, "integer"),
        ("presence_penalty", False, "number"),
        ("frequency_penalty", True, "number"),
        ("echo", 0, "true or false"),
        ("presence_penalty", 3, "[-2, 2]"),
        ("logprobs", 6, "integer in [0, 5]"),
        ("logprobs", True, "integer in [0, 5]"),
    ],
)
def test_openai_values_are_typed_and_ranged(server, field, value, says):
    assert says in refused_by(server, field, extra_body={field: value})


def test_neutral_values_still_pass(server):
    r = client(server).completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=4,
        top_p=1,
        n=1,
        presence_penalty=0,
        frequency_penalty=0.0,
        best_of=1,
        echo=False,
        extra_body=FAST,
    )
    assert r.choices[0].text
    chat = client(server).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        logprobs=False,
        top_p=1.0,
        extra_body=FAST,
    )
    assert chat.choices[0].message.content is not None


def test_chat_top_logprobs_over_the_limit_are_refused(server):
    # logprobs are answered since issue 44 (tests/test_logprobs.py); past the API's limit of 20 they are not.
    assert "[0, 20]" in refused_by(
        server, "top_logprobs", chat=True, logprobs=True, top_logprobs=21, extra_body=FAST
    )


@pytest.mark.parametrize(
    "field, value",
    [("num_to_transfer", 2), ("minimal_topk", 2), ("max_post_steps", 4), ("editing_threshold", 0.5)],
)
def test_block_diffusion_settings_are_refused_on_a_full_sequence_model(server, field, value):
    message = refused_by(server, field, extra_body={field: value})
    assert "does not apply" in message


@pytest.mark.parametrize(
    "field, value",
    [("wino_draft", 0.5), ("eb_gamma", 0.1), ("elastic_gamma", 0.5), ("gating", False), ("threshold", 0.5)],
)
def test_a_setting_the_method_does_not_read_is_refused(server, field, value):
    message = refused_by(server, field, extra_body={"method": "vanilla", field: value})
    assert "does not apply to method 'vanilla'" in message


@pytest.mark.parametrize("method", ["elastic", "cai-elastic", "dkv", "dkv-greedy", "es-dllm", "cai-es"])
def test_method_caches_are_refused_on_a_block_causal_model_with_advice_that_works(bd_server, method):
    message = refused_by(bd_server, "method", extra_body={"method": method})
    assert "block-causal" in message
    advised = message.split("use method '")[1].split("'")[0]
    r = client(bd_server).completions.create(
        model="tiny-bd", prompt=PROMPT, max_tokens=4, extra_body={"method": advised}
    )
    assert r.model_extra["caidllm"]["method"] == advised


@pytest.mark.parametrize("fields", [{"method": "wino"}, {"method": "wino", "cache": "none"}])
def test_wino_is_refused_on_a_block_causal_model_with_advice_that_works(bd_server, fields):
    """Once: advice cache='none', which a second 400 refused (WINO's verify forward needs bidirectional
    attention whatever the cache)."""
    message = refused_by(bd_server, "method", extra_body=fields)
    assert "cache='none'" not in message and "use method 'fastdllm'" in message
    r = client(bd_server).completions.create(
        model="tiny-bd", prompt=PROMPT, max_tokens=4, extra_body={"method": "fastdllm"}
    )
    assert r.model_extra["caidllm"]["method"] == "fastdllm"


def test_an_error_at_submit_names_its_field(server):
    message = refused_by(server, "elastic_layer", extra_body={"method": "elastic", "elastic_layer": 100})
    assert "beyond the model's layers" in message
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": [10**6], "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
