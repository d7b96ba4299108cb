"""OpenAI response bodies and stream chunks for a Call (serve/app.py)."""

from __future__ import annotations

import json
import time

from caidllm.serve.logprobs import body as logprob_body


def sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _head(call, obj: str) -> dict:
    return {"id": call.id, "object": obj, "created": int(time.time()), "model": call.req.model}


def usage(call) -> dict:
    prompt = sum(len(p) for p in call.req.prompts)
    completion = sum(a.completion_tokens for a in call.answers)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def stats(call) -> dict:
    """The `caidllm` extension field: how the answer was decoded."""
    c = call.req.config
    per_choice = [a.stats() for a in call.answers]
    return {
        "method": c.method,
        "gen_length": c.gen_length,
        "block_length": c.block_length,
        **per_choice[0],
        "choices": per_choice,
    }


def complete(call) -> dict:
    chat = call.req.kind == "chat"
    choices = []
    for i, a in enumerate(call.answers):
        choice = {"index": i, "finish_reason": a.finish_reason, "logprobs": _logprobs(call, a)}
        calls = call.req.tools.calls_in(a.text) if chat and call.req.tools is not None else None
        if calls:
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
            choice["finish_reason"] = "tool_calls"
        elif chat:
            choice["message"] = {"role": "assistant", "content": a.text}
        else:
            choice["text"] = a.text
        choices.append(choice)
    return {
        **_head(call, "chat.completion" if chat else "text_completion"),
        "choices": choices,
        "usage": usage(call),
        "caidllm": stats(call),
    }


def _logprobs(call, answer) -> dict | None:
    """The logprobs object of the answer's tokens not yet handed out (None when not asked for)."""
    if call.req.logprobs is None:
        return None
    entries, ids, offset = answer.new_logprobs()
    return logprob_body(answer.lm, call.req.kind, entries, ids, offset)


def _chunk(call, index: int, text: str | None, finish_reason=None, role: bool = False) -> dict:
    chat = call.req.kind == "chat"
    with_logprobs = text and not role and call.req.logprobs is not None
    choice = {
        "index": index,
        "logprobs": _logprobs(call, call.answers[index]) if with_logprobs else None,
        "finish_reason": finish_reason,
    }
    if chat:
        delta = {"role": "assistant"} if role else {}
        if text:
            delta["content"] = text
        if role:
            delta["content"] = ""
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    chunk = {**_head(call, "chat.completion.chunk" if chat else "text_completion"), "choices": [choice]}
    if call.req.include_usage:
        chunk["usage"] = None
    return chunk


def first_chunk(call) -> dict:
    """Chat streams open with the assistant role; completion streams with an empty text."""
    return _chunk(call, 0, None, role=call.req.kind == "chat")


def chunks(call, index: int, delta: str, event) -> list[dict]:
    """The chunks one step of one choice produces: its new text (if any, or if commit events were
    asked for), and the finishing chunk when its answer ended."""
    out = []
    if call.req.tools is not None:  # a tool call is known only once the answer is whole: sent then
        delta = ""
    if delta or call.req.commit_events or event.draft is not None:
        chunk = _chunk(call, index, delta)
        if call.req.commit_events:
            chunk["caidllm"] = {"commit_events": commit_events(call, event)}
            if event.reused_positions is not None:  # the request's first step: what the prefix store gave it
                chunk["caidllm"]["prefix_cache"] = prefix_cache_info(call, event)
        if event.draft is not None:  # provisional (stream_draft): the uniform-state decoders' draft canvas
            chunk.setdefault("caidllm", {})["draft"] = draft(call, event.draft)
        out.append(chunk)
    answer = call.answers[index]
    if answer.finish_reason:
        reason = answer.finish_reason
        if call.req.tools is not None:
            whole, reason = _tool_chunk(call, index, answer)
            out.append(whole)
        final = _chunk(call, index, None, reason)
        if call.req.logprobs is not None:  # tokens with no text of their own, not yet handed out
            final["choices"][0]["logprobs"] = _logprobs(call, answer)
        final["caidllm"] = {"method": call.req.config.method, **answer.stats()}
        out.append(final)
    return out


def _tool_chunk(call, index: int, answer) -> tuple[dict, str]:
    """A tools request's whole answer in one chunk: its tool calls (OpenAI's delta format), or its text."""
    calls = call.req.tools.calls_in(answer.text)
    chunk = _chunk(call, index, None if calls else answer.text)
    if not calls:
        return chunk, answer.finish_reason
    chunk["choices"][0]["delta"]["tool_calls"] = [{"index": n, **c} for n, c in enumerate(calls)]
    return chunk, "tool_calls"


def commit_events(call, event) -> list[dict]:
    lm = call.answers[0].lm
    return [
        {
            "position": p,
            "token": t,
            "text": lm.decode([t]),
            "step": event.step,
            "block": event.block,
            "block_start": event.block_start,
            "s_i": s,
        }
        for p, t, s in zip(event.positions, event.token_ids, event.first_confidence)
    ]


def draft(call, d: dict) -> dict:
    """A step's draft (stream_draft; provisional): its canvas, the step, where the canvas starts in the
    answer, the argmax token and text of every canvas position, the offsets the step accepted and the tokens
    they kept (the rule's: a sample may differ from the argmax)."""
    lm, length = call.answers[0].lm, len(d["tokens"])
    return {
        "canvas": d["canvas"],
        "step": d["step"],
        "start": d["canvas"] * length,
        "tokens": d["tokens"],
        "text": [lm.decode([t]) for t in d["tokens"]],
        "accepted": d["accepted"],
        "kept": d["kept"],
    }


def prefix_cache_info(call, event) -> dict:
    """A request's prompt as the prefix store served it: positions taken from the store (whole blocks
    from the prompt's start) and the prompt's length, in blocks of block_length."""
    return {
        "reused_positions": event.reused_positions,
        "prompt_positions": event.prompt_length,
        "block_length": call.req.config.block_length,
    }


def usage_chunk(call) -> dict:
    chat = call.req.kind == "chat"
    return {
        **_head(call, "chat.completion.chunk" if chat else "text_completion"),
        "choices": [],
        "usage": usage(call),
    }
