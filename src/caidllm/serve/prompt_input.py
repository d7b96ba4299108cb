"""A request's prompt text checked and tokenised (serve/protocol.py's parse): valid Unicode everywhere in
the body, `messages` through the chat template (tool turns included), `prompt` as text or token ids, each
bounded by the server's limits before the tokenizer spends time on it."""

from __future__ import annotations

from caidllm.checks import is_id_list
from caidllm.errors import InputError
from caidllm.serve import tools
from caidllm.serve.request_types import RequestError, ServerDefaults


def check_prompt_lengths(prompts: list, defaults: ServerDefaults, prompt_field: str) -> None:
    if defaults.max_prompt_tokens is not None:
        for ids in prompts:
            if len(ids) > defaults.max_prompt_tokens:
                raise RequestError(
                    f"the prompt has {len(ids)} tokens; this server takes at most "
                    f"{defaults.max_prompt_tokens}",
                    prompt_field,
                )


def check_text(body: dict) -> None:
    """Every string of the body (keys too) must be valid Unicode: JSON may carry a lone surrogate
    ("\\ud800"), which no tokenizer takes. Iterative, so deep nesting cannot exhaust the stack."""
    for top, value in body.items():
        stack = [top, value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    name = top.encode("utf-8", "backslashreplace").decode("utf-8")
                    raise RequestError(
                        f"{name!r} holds text that is not valid Unicode (a lone surrogate such as \\ud800)",
                        name,
                    ) from None
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)


def prompt_char_limit(lm) -> int:
    """Text longer than this cannot fit the model's context, so it is refused before the tokenizer
    spends seconds on it: a token covers at most as many characters as its longest vocabulary entry
    has (byte-level, SentencePiece and WordPiece entries alike), with 4x to spare for normalizers."""
    longest = max(map(len, lm.tokenizer.get_vocab()), default=1)
    return 4 * longest * lm.config.max_length


def _check_length(text: str, defaults: ServerDefaults, param: str) -> None:
    if defaults.max_prompt_chars is not None and len(text) > defaults.max_prompt_chars:
        raise RequestError(
            f"the {param} has {len(text)} characters; no text over {defaults.max_prompt_chars} "
            "characters fits the model's context",
            param,
        )


def messages_to_ids(messages, lm, defaults: ServerDefaults, tool_request=None) -> list[list[int]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise RequestError(
                f"messages[{i}] must be an object with role system, user, assistant or tool", "messages"
            )
        if m["role"] in ("assistant", "tool"):  # a tool call and its result, fed back through the template
            try:
                m = tools.turn(m, i, tool_request)
            except tools.ToolError as error:
                raise RequestError(error.message, error.param) from None
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text ones
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content
            ):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", "messages")
        if not isinstance(m.get("name", ""), str):
            raise RequestError(f"messages[{i}].name must be a string", "messages")
        extra = set(m) - {"role", "content", "name", "tool_calls", "tool_call_id"}
        if extra:
            raise RequestError(
                f"messages[{i}] has fields caidllm does not support: {', '.join(sorted(extra))}", "messages"
            )
        turns.append(
            {
                "role": m["role"],
                "content": content,
                **{k: m[k] for k in ("tool_calls", "tool_call_id") if k in m},
            }
        )
    if not any(t["content"].strip() for t in turns):
        raise RequestError("messages are all empty", "messages")
    _check_length("".join(t["content"] for t in turns), defaults, "messages")
    try:
        if tool_request is not None and not tool_request.format.renders_tools:
            turns = [tool_request.system_message()] + turns
        return [
            lm.encode_messages(
                turns,
                tools=tool_request.tools
                if tool_request is not None and tool_request.format.renders_tools
                else None,
            )
        ]
    except InputError as error:
        raise RequestError(str(error), "messages") from None
    except Exception as error:  # noqa: BLE001 - a template that rejects this conversation
        raise RequestError(f"the chat template rejects these messages: {error}", "messages") from None


def prompts_to_ids(prompt, lm, defaults: ServerDefaults) -> list[list[int]]:
    if isinstance(prompt, str) or is_id_list(prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError("prompt must be a string, a list of strings, or token ids", "prompt")
    if len(prompt) > defaults.max_prompts:
        raise RequestError(f"{len(prompt)} prompts in one request; at most {defaults.max_prompts}", "prompt")
    out = []
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            if not p.strip():
                raise RequestError(f"prompt {i} is empty", "prompt")
            _check_length(p, defaults, "prompt")
            out.append(lm.tokenizer.encode(p, add_special_tokens=False))
        elif is_id_list(p):
            out.append(list(p))
        else:
            raise RequestError(f"prompt {i} must be a string or a non-empty list of token ids", "prompt")
    return out
