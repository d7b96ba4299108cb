"""`logprobs` / `top_logprobs` in OpenAI bodies: read from the request (chat: logprobs true and top_logprobs
0..20; completions: logprobs 0..5, the alternatives' count), and the response's logprobs objects built from
the engine's entries (decode/logprobs.py: each token's logprob taken at the step that committed it)."""

from __future__ import annotations

from caidllm.checks import is_int
from caidllm.decode.logprobs import MAX_TOP

COMPLETIONS_MAX_TOP = 5  # the OpenAI completions API's limit


class LogprobsError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def requested(body: dict, kind: str) -> int | None:
    """How many top alternatives each token's entry carries (None: no logprobs asked for)."""
    value, top = body.get("logprobs"), body.get("top_logprobs")
    if "echo" in body and not isinstance(body["echo"], bool):
        raise LogprobsError(f"echo must be true or false, got {body['echo']!r}", "echo")
    if body.get("echo"):
        raise LogprobsError(
            "echo (scoring the prompt) is not supported: a diffusion model's prompt is never "
            "committed token by token",
            "echo",
        )
    if kind != "chat":
        if top is not None:
            raise LogprobsError(
                "'top_logprobs' is not a field of this endpoint (logprobs: N is)", "top_logprobs"
            )
        if value is not None and not (is_int(value) and 0 <= value <= COMPLETIONS_MAX_TOP):
            raise LogprobsError(
                f"logprobs must be an integer in [0, {COMPLETIONS_MAX_TOP}], got {value!r}", "logprobs"
            )
        return value
    if value is not None and not isinstance(value, bool):
        raise LogprobsError(f"logprobs must be true or false, got {value!r}", "logprobs")
    if top is not None and not (is_int(top) and 0 <= top <= MAX_TOP):
        raise LogprobsError(f"top_logprobs must be an integer in [0, {MAX_TOP}], got {top!r}", "top_logprobs")
    if top is not None and not value:
        raise LogprobsError("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if value else None


def body(lm, kind: str, entries: list, token_ids: list[int], offset: int = 0) -> dict:
    """The OpenAI logprobs object of these tokens (entries: (logprob, [(token, logprob)]) each)."""

    def text(token):
        return lm.decode([token])

    if kind == "chat":

        def item(token, logprob):
            return {"token": text(token), "logprob": logprob, "bytes": list(text(token).encode("utf-8"))}

        return {
            "content": [
                {**item(t, lp), "top_logprobs": [item(a, alp) for a, alp in top]}
                for t, (lp, top) in zip(token_ids, entries)
            ],
            "refusal": None,
        }
    offsets, at = [], offset
    for t in token_ids:
        offsets.append(at)
        at += len(text(t))
    return {
        "tokens": [text(t) for t in token_ids],
        "token_logprobs": [lp for lp, _ in entries],
        "top_logprobs": [{text(a): alp for a, alp in top} for _, top in entries],
        "text_offset": offsets,
    }
