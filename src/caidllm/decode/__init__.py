"""Block-wise denoising: one engine loop, small commit policies, method presets."""

from caidllm.decode.api import GenerationResult, Trace, generate
from caidllm.decode.config import CAISettings, DecodeConfig
from caidllm.decode.presets import PRESETS, build_config, method_names

__all__ = ["generate", "GenerationResult", "Trace", "DecodeConfig", "CAISettings", "PRESETS", "build_config",
           "method_names"]
