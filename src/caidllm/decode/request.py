"""One request in the step-level engine: what it asked for, where it is, and
what it has produced so far; and the events the engine reports for it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from caidllm.decode.block_diffusion import Layout
from caidllm.decode.config import DecodeConfig
from caidllm.decode.policies import Policy


@dataclass
class CommitEvent:
    """What one denoising step did for one request."""

    request_id: str
    block: int  # 0-based block of the generation
    step: int  # local step t within the block
    positions: list[int]  # positions of the generated region committed at this step
    token_ids: list[int]  # their tokens
    first_confidence: list[float]  # their s_i (confidence at the block's first step)
    finished: bool = False
    # Answer tokens committed left to right without a gap so far (stops at the end token):
    # what a stream can show.
    prefix_length: int = 0
    at: float = field(default_factory=time.perf_counter)  # when the step's results reached the host
    result: object | None = None  # the GenerationResult, on the request's last event
    # Where the step's block starts in the generated region: < 0 for a block-diffusion block that
    # holds the end of the prompt (its first -block_start positions are prompt).
    block_start: int = 0


@dataclass
class Request:
    """Per-request state. Tokens, traces and counters live on the host (they are
    read every step for the events anyway); the canvas row and the KV cache row
    live in the engine's Frame, at ``slot``; the policy's state and the
    previous step's view (for early skipping) are small device tensors."""

    id: str
    prompt: list[int]
    config: DecodeConfig
    gating: bool
    refresh_every: int
    policy: Policy
    state_names: tuple[str, ...]
    policy_key: tuple  # requests with equal keys run the same policy with the same settings
    generator: torch.Generator | None
    submitted_at: float = field(default_factory=time.perf_counter)
    slot: int | None = None
    block: int = 0
    step: int = 0  # local step within the block
    steps_before_block: int = 0
    nfe: int = 0
    computed_pairs: int = 0
    early_stopped: bool = False
    admitted_at: float | None = None
    first_commit_at: float | None = None
    controller_at_admission: float = 0.0
    prefix: int = 0  # longest gap-free committed prefix of the generated region, end token excluded
    answer_end: int | None = None  # position of the first end token, once the prefix reaches it
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    block_first_confidence: torch.Tensor | None = None  # [block] s_i of the current block
    prev_confidence: torch.Tensor | None = None  # [block] the previous step's confidences (early skipping)
    just_committed: torch.Tensor | None = None  # [block] committed at the previous step
    block_causal: bool = False  # a block-diffusion model's request: blocks laid from the prompt's start
    post_steps: int = 0  # token editing: steps run on the current block since its last mask went

    def __post_init__(self):
        self.layout = Layout.of(len(self.prompt), self.config, self.block_causal)
        G = self.layout.span  # gen_length, up to the end of the last block for block diffusion
        self.generated: list[int | None] = [None] * G  # None = still masked
        self.commit_step = [-1] * G
        self.commit_step_in_block = [-1] * G
        self.first_confidence = [math.nan] * G
        self.steps_per_block = [0] * self.layout.num_blocks

    @property
    def block_bounds(self) -> tuple[int, int]:
        """The current block inside the generated region (block diffusion: its start may be
        negative, the block holding the end of the prompt)."""
        bl = self.config.block_length
        first = self.block * bl - self.layout.lead
        return first, first + bl

    def forward_mode(self) -> str:
        """This step's forward: a full one without a cache, at the block start and
        every f steps (a refresh); the cached mode otherwise. The exact block cache runs
        one full forward (the request's first: prompt blocks prefilled), then "block"."""
        c, t = self.config, self.step
        if c.cache == "block":
            return "full" if self.block == 0 and t == 0 else "block"
        refresh = c.cache == "none" or t == 0 or (self.refresh_every > 0 and t % self.refresh_every == 0)
        return "full" if refresh else c.cache

    def fold(self) -> int:
        """Positions left of the block that this step's forward recomputes: the previous block,
        whose final keys/values the block cache writes at the next block's first step."""
        return self.config.block_length if self.config.cache == "block" and self.step == 0 and self.block else 0

    def start_block(self, device) -> None:
        self.state = {name: torch.zeros(1, dtype=torch.long, device=device) for name in self.state_names}

    def advance_prefix(self, eos_ids: set[int]) -> None:
        """Extend the committed prefix; note the answer's end when the prefix reaches an end token."""
        g = self.generated
        while self.answer_end is None and self.prefix < len(g) and g[self.prefix] is not None:
            if g[self.prefix] in eos_ids:
                self.answer_end = self.prefix
            else:
                self.prefix += 1

    def fill_after_end(self, eos_id: int) -> None:
        """Early stop: every position after the first end token becomes EOS (no more steps).
        The commit steps are left alone: a filled position that was masked keeps -1 (never
        committed), one already committed keeps its step (results.Trace)."""
        for p in range(self.answer_end + 1, len(self.generated)):
            self.generated[p] = eos_id
