"""The uniform-state decoders by name: what each draws (a sample or the argmax per position), the rule that
accepts positions and ends a canvas (diffusiongemma_rule.py), and the settings dataclass of its own, if
any (given under its OWNER key: generate(..., dgcai=dict(warmup=0.2))). One line a decoder."""

from __future__ import annotations

from dataclasses import dataclass

from caidllm.decode.diffusiongemma_cai import CaiUniformRule, CaiUniformSettings
from caidllm.decode.diffusiongemma_rule import EntropyBoundRule


@dataclass(frozen=True)
class UniformDecoder:
    rule: EntropyBoundRule
    sample: bool = True  # False: the argmax at each position (canvas init and renoising still drawn)
    settings: type | None = None  # its own settings (a MethodSettings dataclass with a validate())


UNIFORM_DECODERS: dict[str, UniformDecoder] = {
    "diffusiongemma": UniformDecoder(EntropyBoundRule()),  # the official entropy-bound sampler
    "greedy": UniformDecoder(EntropyBoundRule(), sample=False),
    "diffusiongemma-cai": UniformDecoder(CaiUniformRule(), settings=CaiUniformSettings),
}
UNIFORM_METHODS = tuple(UNIFORM_DECODERS)
