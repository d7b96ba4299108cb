"""caidllm: inference engine for masked diffusion language models (LLaDA, Dream)."""

from .models import load
from .decode import generate  # also registers DiffusionLM.generate (models/lm.py)

__all__ = ["generate", "load"]
