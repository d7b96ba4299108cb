"""Tool calls in chat completions: `tools` and `tool_choice` read and checked, the conversation rendered with
them, a forced call's format and arguments held by a constraint (decode/constraints/), and the answer read
back as `tool_calls`.

The call format comes from the model's chat template (TOOL_FORMATS): a template that speaks of `<tool_call>`
(Qwen2.5's, so SDAR's, Fast-dLLM v2's and Dream's; LLaDA2.x's) gets `<tool_call>\\n{"name": ...,
"arguments": ...}\\n</tool_call>` and renders the tools itself; any other (the embedded tiny models') gets
the bare JSON object `{"name": ..., "arguments": ...}`, with the tools described in a system message."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from caidllm.decode.constraints import Constraint
from caidllm.decode.constraints.spec import schema_regex
from caidllm.errors import InputError

_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~")


class ToolError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class ToolFormat:
    """How a call reads in the answer: `open` + {"name": NAME, "arguments": ARGS} + `close`."""

    open: str
    close: str
    renders_tools: bool  # the template lays out `tools` itself (else a system message does)


TOOL_FORMATS = {
    "tool_call_tags": ToolFormat("<tool_call>\n", "\n</tool_call>", True),
    "json": ToolFormat("", "", False),
}


def format_for(lm) -> ToolFormat:
    template = lm.tokenizer.chat_template or ""
    return TOOL_FORMATS["tool_call_tags" if "<tool_call>" in template else "json"]


@dataclass
class ToolRequest:
    tools: list[dict]  # OpenAI's {"type": "function", "function": {...}} entries, checked
    choice: str  # "auto", "required" or the forced function's name
    format: ToolFormat

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def constraint(self, max_tokens: int | None) -> Constraint | None:
        """A forced call (required, or a named function): its format and arguments held in any commit
        order."""
        if self.choice == "auto":
            return None
        chosen = [t for t in self.tools if self.choice == "required" or t["function"]["name"] == self.choice]
        calls = "|".join(f"({self._call_regex(t['function'])})" for t in chosen)
        return Constraint("regex", calls, "tools", max_tokens)

    def _call_regex(self, function: dict) -> str:
        head = self.format.open + '{"name": ' + json.dumps(function["name"]) + ', "arguments": '
        arguments = schema_regex(function.get("parameters", {"type": "object"}), "tools")
        return _literal(head) + arguments + _literal("}" + self.format.close)

    def calls_in(self, text: str) -> list[dict] | None:
        """The answer's tool calls in OpenAI's form (None: the answer is text, not a call)."""
        body = text.strip()
        if not (body.startswith(self.format.open.strip()) and body.endswith(self.format.close.strip())):
            return None
        body = body[len(self.format.open.strip()) : len(body) - len(self.format.close.strip())].strip()
        try:
            call = json.loads(body)
        except ValueError:
            return None
        if (
            not isinstance(call, dict)
            or call.get("name") not in self.names
            or not isinstance(call.get("arguments"), dict)
        ):
            return None
        return [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }
        ]

    def system_message(self) -> dict:
        listed = json.dumps([t["function"] for t in self.tools])
        return {
            "role": "system",
            "content": f"You may call these functions: {listed}. To call one, answer with "
            '{"name": <function name>, "arguments": <its arguments as JSON>}.',
        }

    def call_text(self, call: dict) -> str:
        """An earlier assistant call as the model would have written it (fed back through the template)."""
        function = call.get("function", {})
        arguments = function.get("arguments", "{}")
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        return (
            self.format.open
            + json.dumps({"name": function.get("name"), "arguments": arguments})
            + self.format.close
        )


def _literal(text: str) -> str:
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ("\\n" if ch == "\n" else ch) for ch in text)


def tool_request(body: dict, lm) -> ToolRequest | None:
    """The request's tools (None: none given, or tool_choice "none")."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise ToolError("tool_choice needs tools", "tool_choice")
        return None
    _check_tools(tools)
    names = [t["function"]["name"] for t in tools]
    if choice is None or choice in ("auto", "required", "none"):
        choice = choice or "auto"
    elif (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
    ):
        choice = choice["function"].get("name")
        if choice not in names:
            raise ToolError(
                f"tool_choice names the function {choice!r}, which is not in tools ({', '.join(names)})",
                "tool_choice",
            )
    else:
        raise ToolError(
            "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
            '{"name": ...}}',
            "tool_choice",
        )
    if choice == "none":
        return None
    return ToolRequest(tools, choice, format_for(lm))


def _check_tools(tools) -> None:
    if not isinstance(tools, list):
        raise ToolError('tools must be a list of {"type": "function", "function": {...}} objects', "tools")
    seen = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ToolError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', "tools")
        name = function.get("name")
        if not isinstance(name, str) or not name or name in seen:
            raise ToolError(
                f"tools[{i}].function.name must be a non-empty string, unique among the tools", "tools"
            )
        seen.add(name)
        if not isinstance(function.get("description", ""), str):
            raise ToolError(f"tools[{i}].function.description must be a string", "tools")
        try:
            schema_regex(function.get("parameters", {"type": "object"}), f"tools[{i}].function.parameters")
        except InputError as error:
            raise ToolError(str(error), "tools") from None


def turn(message: dict, index: int, tool_request: ToolRequest | None) -> dict:
    """An assistant turn with tool_calls, or a tool result, as the chat template takes it: as given to a
    template that renders tools; else the call written out as the model writes it, and the result as a `tool`
    turn."""
    out = dict(message)
    calls = message.get("tool_calls")
    if message["role"] == "tool":
        if not isinstance(message.get("tool_call_id", ""), str):
            raise ToolError(f"messages[{index}].tool_call_id must be a string", "messages")
    elif calls is not None:
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
        ):
            raise ToolError(
                f'messages[{index}].tool_calls must be a list of {{"function": {{...}}}} objects', "messages"
            )
        written = tool_request or ToolRequest([], "auto", TOOL_FORMATS["json"])
        try:
            text = "\n".join(written.call_text(c) for c in calls)
        except ValueError:
            raise ToolError(f"messages[{index}].tool_calls: arguments must be JSON", "messages") from None
        if out.get("content") is None:
            out["content"] = ""
        if not written.format.renders_tools:
            out.pop("tool_calls")
            out["content"] = (out["content"] + "\n" + text).strip()
    return out
