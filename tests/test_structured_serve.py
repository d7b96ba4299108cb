"""Structured output through `caidllm serve` with the official `openai` client: response_format json_schema
and json_object, the regex and choice extensions, streamed and not, and the 400s naming the field."""

import json
import re

import httpx
import jsonschema
import openai
import pytest

from helpers.serve import start

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "result", "schema": SCHEMA, "strict": True}}
ASK = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture(scope="module")
def server(tiny):
    with start(tiny, max_batch=8, max_queue=64) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_json_schema_answer_validates_streamed_and_not(client):
    whole = client.chat.completions.create(model="tiny", messages=ASK, response_format=FORMAT, max_tokens=40)
    jsonschema.validate(json.loads(whole.choices[0].message.content), SCHEMA)
    pieces = client.chat.completions.create(
        model="tiny", messages=ASK, response_format=FORMAT, max_tokens=40, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == whole.choices[0].message.content


def test_json_object_and_the_regex_and_choice_extensions(client):
    r = client.chat.completions.create(
        model="tiny", messages=ASK, response_format={"type": "json_object"}, max_tokens=48
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.chat.completions.create(
        model="tiny", messages=ASK, extra_body={"regex": r"The answer is [0-9]+\."}, max_tokens=16
    )
    assert re.fullmatch(r"The answer is [0-9]+\.", r.choices[0].message.content)
    r = client.completions.create(
        model="tiny", prompt="3 + 4 is", extra_body={"choice": ["seven", "eight"]}, max_tokens=16
    )
    assert r.choices[0].text in ("seven", "eight")


def test_an_answer_cut_at_max_tokens_ends_inside_it(client):
    # max_tokens 24 under a 32-position canvas (two blocks of 16): the JSON must close by token 24.
    r = client.chat.completions.create(
        model="tiny", messages=ASK, response_format=FORMAT, max_tokens=24, extra_body={"gen_length": 32}
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert r.usage.completion_tokens <= 24


@pytest.mark.parametrize(
    "body, param, words",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objec"}},
                }
            },
            "response_format",
            "cannot be compiled",
        ),
        ({"response_format": FORMAT, "max_tokens": 3}, "response_format", "shortest answer takes"),
        ({"regex": "x[a&&b]"}, "regex", "cannot be compiled"),
        ({"regex": ""}, "regex", "non-empty string"),
        ({"choice": "yes"}, "choice", "non-empty list"),
        (
            {"response_format": {"type": "yaml"}},
            "response_format",
            "type 'text', 'json_object' or 'json_schema'",
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format",
            "must be an object with name and schema",
        ),
        ({"response_format": FORMAT, "regex": "a"}, "regex", "give one of"),
        ({"response_format": FORMAT, "stop": ["}"]}, "stop", "cannot be combined"),
        (
            {"regex": "[0-9]+", "method": "wino", "gen_length": 32, "block_length": 32},
            "regex",
            "revises committed",
        ),
    ],
)
def test_bad_constraints_are_400_naming_the_field(server, body, param, words):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": ASK, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_refused_constraints_leave_the_requests_in_flight_unharmed(client, server):
    import threading

    alone = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        response_format=FORMAT,
        max_tokens=64,
        extra_body={"method": "vanilla", "gen_length": 64, "block_length": 64},
    )
    answers = []
    flight = threading.Thread(
        target=lambda: answers.append(
            client.chat.completions.create(
                model="tiny",
                messages=ASK,
                response_format=FORMAT,
                max_tokens=64,
                extra_body={"method": "vanilla", "gen_length": 64, "block_length": 64},
            )
        )
    )
    flight.start()
    for bad in ({"regex": "x[a&&b]"}, {"response_format": FORMAT, "max_tokens": 3}, {"choice": []}):
        r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": ASK, **bad}, timeout=60)
        assert r.status_code == 400
    flight.join(timeout=120)
    assert answers[0].choices[0].message.content == alone.choices[0].message.content
