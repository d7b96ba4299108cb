"""caidllm: inference engine for masked diffusion language models (LLaDA, Dream)."""

from .decode import generate  # also registers DiffusionLM.generate (models/lm.py)
from .models import load

__all__ = ["generate", "load"]
