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
    """Arguments or inputs to a model or decoder are invalid."""


class EngineFullError(CaidllmError):
    """The engine's queue is full: the request was not accepted (try again later)."""


class RankFailure(CaidllmError):
    """A rank of a tensor-parallel group failed or died: the whole group stops."""
