"""Block-wise denoising: one engine loop, small commit policies, method presets."""

from caidllm.decode.api import GenerationResult, Trace, generate
from caidllm.decode.config import DecodeConfig
from caidllm.decode.methods import PRESETS, method_names
from caidllm.decode.policies.cai import CAISettings
from caidllm.decode.presets import build_config

__all__ = [
    "generate",
    "GenerationResult",
    "Trace",
    "DecodeConfig",
    "CAISettings",
    "PRESETS",
    "build_config",
    "method_names",
]
