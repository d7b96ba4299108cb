"""Errors raised for bad input.

Every error a user can cause is a ``CaidllmError`` whose message names the
offending value and what was expected, so callers (and the CLI) can show it
without a traceback from deep inside torch.
"""


class CaidllmError(ValueError):
    """Base class for all user-facing errors of caidllm."""


class ModelLoadError(CaidllmError):
    """A model folder, config, weight file or tokenizer could not be used."""


class InputError(CaidllmError):
    """Arguments or inputs to a model or decoder are invalid. `field`: the setting or input the error
    is about, as the caller named it (the server's `param`; None when it is about no one field)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class EngineFullError(CaidllmError):
    """The engine's queue is full: the request was not accepted (try again later)."""


class RankFailure(CaidllmError):
    """A rank of a tensor-parallel group failed or died: the whole group stops."""
