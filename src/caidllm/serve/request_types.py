"""The server's request types: the error a refused request becomes (an OpenAI error body), the defaults a
request gets from `caidllm serve`'s flags, and a parsed request ready for the engine (serve/protocol.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from caidllm.decode.config import DecodeConfig
from caidllm.decode.constraints import Constraint


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI error body."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        self.error_type, self.code, self.headers = error_type, code, headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class ServerDefaults:
    """What a request gets for the settings it does not give (the `caidllm serve` flags)."""

    model_name: str
    method: str = "cai"
    gen_length: int = 256
    block_length: int = 64
    max_gen_length: int = 1024  # the largest canvas a request may ask for
    max_prompt_tokens: int | None = None  # None: whatever fits the model's context
    max_prompts: int = 16  # prompts in one /v1/completions request
    settings: object = (
        None  # a calibrate settings file (CalibratedSettings): its values are the defaults of its method
    )
    max_prompt_chars: int | None = (
        None  # longer text cannot fit the context: refused untokenised (prompt_char_limit)
    )


@dataclass
class DecodeRequest:
    kind: str  # "chat" or "completion"
    prompts: list[list[int]]  # token ids, one per choice
    config: DecodeConfig
    max_tokens: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    commit_events: bool
    model: str
    extensions: dict = field(default_factory=dict)
    constraint: Constraint | None = None  # structured output (serve/structured.py)
    logprobs: int | None = (
        None  # top alternatives per token's logprob entry; None: no logprobs (serve/logprobs.py)
    )
    tools: object | None = None  # the chat request's ToolRequest (serve/tools.py)
