"""One request's state under the uniform-state decoders (owned by the method, not by the mask engine):
its cache, its canvas being denoised, the self-conditioning input of its next step, the stability
history, its own random generator, and the canvases finished so far.

Random draws, in the reference's order: a canvas's initial tokens (one randint over the canvas), then at
each step the sampled tokens (a multinomial per position, in position order) and the renoise tokens
(one randint over the canvas), drawn whether or not the canvas then stops.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from caidllm.decode.diffusiongemma_settings import DiffusionGemmaSettings
from caidllm.models.diffusion_gemma_cache import DGCache


@dataclass
class CanvasRequest:
    id: str
    prompt: list[int]
    settings: DiffusionGemmaSettings
    generator: torch.Generator
    cache: DGCache
    vocab_size: int
    canvas_length: int
    canvases_wanted: int
    canvas: torch.Tensor | None = None  # [L] the current (noisy) canvas
    argmax: torch.Tensor | None = None  # [L] the latest argmax canvas: the output when the canvas ends
    soft: torch.Tensor | None = None  # [L, hidden] self-conditioning input of the next step (None: first)
    history: torch.Tensor | None = None  # [stability_threshold, L] the argmax canvases of the last steps
    accepted: torch.Tensor | None = None  # [L] bool: the positions the last step accepted
    step: int = 0  # steps run on the current canvas
    rule_state: object | None = None  # what the decoder's rule keeps of the current canvas (None: fresh)
    generated: list[int] = field(default_factory=list)
    steps_per_canvas: list[int] = field(default_factory=list)
    answer_length: int = 0  # answer tokens of the finished canvases (to the end token)
    nfe: int = 0  # decoder forwards
    encoder_forwards: int = 0
    finished: bool = False
    ended_by_eos: bool = False
    admitted_at: float = field(default_factory=time.perf_counter)

    def new_canvas(self, device) -> None:
        """Uniformly random tokens (the reference's canvas initialisation), a fresh history."""
        L = self.canvas_length
        self.canvas = torch.randint(0, self.vocab_size, (1, L), generator=self.generator, device=device)[0]
        self.argmax, self.soft, self.step, self.rule_state = self.canvas, None, 0, None
        # more rows than steps could never all be filled (the canvas is never stable, as with k): a huge
        # stability_threshold must not allocate [k, L]
        k = min(self.settings.stability_threshold, self.settings.max_denoising_steps)
        self.history = torch.full((k, L), -1, dtype=torch.long, device=device) if k else None

    @property
    def config(self) -> DiffusionGemmaSettings:  # what parallel/mirror.py sends the other ranks
        return self.settings

    policy_state = None  # (the mask engine's requests' field the mirror reads; none here)

    @property
    def cur_step(self) -> int:
        """The reference's step counter: N at the first step, down to 1 at the last."""
        return self.settings.max_denoising_steps - self.step

    def stable(self, argmax: torch.Tensor) -> bool:
        """Whether `argmax` equals each of the last stability_threshold argmax canvases; records it."""
        if self.history is None:
            return True
        same = bool((self.history == argmax[None]).all())
        self.history = torch.roll(self.history, shifts=-1, dims=0)
        self.history[-1] = argmax
        return same
