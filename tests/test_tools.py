"""Tool calls through `caidllm serve` with the official `openai` client on the embedded models (tiny, tiny-bd,
tiny-moe): a forced call (named and required) whose arguments validate, an auto call, streamed and not, tool
results fed back, and the 400s for malformed tools."""

import json

import httpx
import jsonschema
import openai
import pytest

import caidllm
from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "the weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=["tiny", "tiny-bd", "tiny-moe"])
def served(request):
    lm = caidllm.load(request.param)
    block = lm.config.block_lengths[0] if lm.config.block_causal else 16
    defaults = ServerDefaults(model_name=request.param, gen_length=64, block_length=block, max_gen_length=128)
    with LocalServer(create_app(lm, ServerConfig(defaults=defaults, max_batch=4, max_queue=16))) as server:
        yield request.param, server


def _client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _ask(served, **kw):
    name, server = served
    return _client(server).chat.completions.create(
        model=name, messages=kw.pop("messages", ASK), tools=TOOLS, max_tokens=64, **kw
    )


def test_a_named_forced_call_has_valid_arguments_streamed_and_not(served):
    forced = {"type": "function", "function": {"name": "get_weather"}}
    r = _ask(served, tool_choice=forced)
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    chunks = list(_ask(served, tool_choice=forced, stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0][0].function.arguments == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_required_calls_one_of_the_tools_and_auto_answers_text_or_a_call(served):
    r = _ask(served, tool_choice="required")
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "add") and isinstance(
        json.loads(call.function.arguments), dict
    )
    auto = _ask(served, tool_choice="auto")
    message = auto.choices[0].message
    assert (message.tool_calls is None) == (auto.choices[0].finish_reason != "tool_calls")
    streamed = "".join(c.choices[0].delta.content or "" for c in _ask(served, stream=True) if c.choices)
    assert message.tool_calls or streamed == message.content


def test_a_tool_result_is_fed_back(served):
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]
    r = _ask(served, messages=history, tool_choice="none")
    assert r.choices[0].message.content is not None and r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"tools": [{"type": "function"}]}, "tools", "tools[0] must be"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objec"}}}]},
            "tools",
            "cannot be compiled",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
            "cannot be combined",
        ),
    ],
)
def test_malformed_tools_are_400_naming_the_field(served, body, param, words):
    _, server = served
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": ASK, **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


TAGGED_TEMPLATE = (
    "{{ bos_token }}{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\nTools: ' }}"
    "{% for tool in tools %}{{ tool.function.name }} {% endfor %}{{ 'Call one inside "
    "<tool_call></tool_call>.' }}"
    "{{ '<|eot_id|>' }}{% endif %}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
)


def test_a_template_that_speaks_of_tool_call_tags_gets_that_format_and_renders_the_tools():
    from caidllm.serve.tools import TOOL_FORMATS, tool_request

    lm = caidllm.load("tiny")
    lm.tokenizer.chat_template = TAGGED_TEMPLATE  # this load's own tokenizer (a Qwen-style template)
    request = tool_request({"tools": TOOLS, "tool_choice": "required"}, lm)
    assert request.format == TOOL_FORMATS["tool_call_tags"] and request.format.renders_tools
    prompt = lm.tokenizer.decode(lm.encode_messages(ASK, tools=TOOLS))
    assert "Tools: get_weather add" in prompt
    (result,) = lm.generate(
        [lm.encode_messages(ASK, tools=TOOLS)],
        method="cai",
        gen_length=96,
        block_length=32,
        constraint=request.constraint(None),
    )
    assert result.text.startswith("<tool_call>\n") and result.text.endswith("\n</tool_call>")
    (call,) = request.calls_in(result.text)
    assert call["function"]["name"] in ("get_weather", "add")
    written = request.call_text(call)  # fed back as the model wrote it
    assert request.calls_in(written)[0]["function"]["arguments"] == call["function"]["arguments"]
