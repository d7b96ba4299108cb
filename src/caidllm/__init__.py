"""caidllm: inference engine for masked diffusion language models (LLaDA, Dream)."""

from .models import load

__all__ = ["load"]
