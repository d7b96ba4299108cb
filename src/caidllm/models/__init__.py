"""Model layer: LLaDA and Dream as plain torch modules, and loading of
Hugging Face-format folders into a DiffusionLM."""

from .cache import KVCache
from .config import ModelConfig
from .dream import DreamModel
from .llada import LLaDAModel
from .lm import DiffusionLM
from .loading import load
from .skip import EarlySkip

__all__ = ["DiffusionLM", "DreamModel", "EarlySkip", "KVCache", "LLaDAModel", "ModelConfig", "load"]
