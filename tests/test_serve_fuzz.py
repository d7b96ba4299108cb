"""Property-based fuzzing of the server (Hypothesis): request bodies from the OpenAI request schema
plus caidllm's fields, mutated (wrong types, out-of-range numbers, odd unicode, huge and empty
strings, extra and missing fields), against a live server. Whatever the body: no 5xx, a 4xx is an
OpenAI error body naming the field, and a normal request is answered correctly right after.

Bounded and reproducible: the "ci" profile (the default) runs a fixed number of examples with a
fixed seed; HYPOTHESIS_PROFILE=explore runs many more, randomly.
"""

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caidllm.serve.protocol import NEUTRAL, OPENAI_FIELDS
from helpers.serve import PROMPT, start

settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "explore",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FAST = {"method": "fastdllm", "gen_length": 16, "block_length": 16}
CAIDLLM_FIELDS = [
    "method",
    "gen_length",
    "block_length",
    "steps",
    "cache",
    "threshold",
    "early_stop",
    "refresh_every",
    "factor",
    "policy",
    "es_alpha",
    "es_schedule",
    "theta_start",
    "gating",
    "factors",
    "grinding_action",
    "cai",
    "commit_events",
]
FIELDS = sorted(OPENAI_FIELDS | set(NEUTRAL)) + CAIDLLM_FIELDS

odd_text = st.one_of(
    st.text(max_size=20),  # any code point, surrogates included
    st.sampled_from(
        [
            "",
            " ",
            "\x00",
            "\ud800",
            "a\udfffb",
            "\u202e",
            "\ufeff",
            "e\u0301",
            "\U0001f600" * 3,
            "x" * 100_000,
            "tiny",
            "cai",
            "vanilla",
            "dual",
            "none",
        ]
    ),
)
numbers = st.one_of(
    st.integers(-3, 300),
    st.integers(),
    st.sampled_from([0, 1, 16, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, odd_text)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=3)),
    max_leaves=8,
)
messages = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant", "tool", ""]),
                "content": st.one_of(odd_text, values),
            }
        ),
        max_size=3,
    ),
    values,
)


@st.composite
def bodies(draw):
    """(endpoint, body): a valid request, then a few mutations of it."""
    chat = draw(st.booleans())
    body = {"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT}
    body.update(max_tokens=4, **FAST)
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "set", "set", "drop", "text", "unknown"]))
        if action == "set":
            body[draw(st.sampled_from(FIELDS))] = draw(values)
        elif action == "drop" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif action == "text":
            body["messages" if chat else "prompt"] = draw(messages if chat else st.one_of(odd_text, values))
        else:
            body[draw(odd_text)] = draw(values)
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


@pytest.fixture(scope="module")
def server(tiny):
    with start(tiny, max_gen_length=64, max_request_time=20.0) as s:
        yield s


@pytest.fixture(scope="module")
def normal(tiny):
    """A normal request and the text it must get."""
    (want,) = tiny.generate([PROMPT], chat=False, **FAST)
    return {"prompt": PROMPT, "max_tokens": 4, **FAST}, tiny.decode(want.token_ids[:4])


@given(case=bodies())
def test_no_body_makes_a_5xx(server, normal, case):
    path, body = case
    raw = json.dumps(body, allow_nan=True)  # lone surrogates travel as \ud800 escapes, as JSON allows
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code < 500, (r.status_code, r.text)
        if r.status_code >= 400:
            error = r.json()["error"]
            assert error["message"] and error["type"], error
            if r.status_code in (400, 404):
                assert isinstance(error["param"], str), error  # names the field (a field may be named "")
        elif body.get("stream") is True:
            assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
        else:
            assert isinstance(r.json()["choices"], list)
        request, text = normal
        after = client.post("/v1/completions", json=request)
        assert after.status_code == 200 and after.json()["choices"][0]["text"] == text, after.text
