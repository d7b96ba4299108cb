"""One request in the step-level engine: what it asked for, where it is, and
what it has produced so far (its own bookkeeping, step by step, and its
result); and the events the engine reports for it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from caidllm.decode.config import DecodeConfig
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.policies import Policy, policy_spec
from caidllm.decode.results import GenerationResult, result_of
from caidllm.models.forward_modes import ForwardMode


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
    policy_seconds_at_admission: float = 0.0  # the engine's policy time when this request took its slot
    prefix: int = 0  # longest gap-free committed prefix of the generated region, end token excluded
    answer_end: int | None = None  # position of the first end token, once the prefix reaches it
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    block_first_confidence: torch.Tensor | None = None  # [block] s_i of the current block
    prev_confidence: torch.Tensor | None = None  # [block] the previous step's confidences (early skipping)
    just_committed: torch.Tensor | None = None  # [block] committed at the previous step
    last_committed: list[int] = field(default_factory=list)  # generated positions committed at the previous step

    def __post_init__(self):
        G, c = self.config.gen_length, self.config
        self.generated: list[int | None] = [None] * G  # None = still masked
        self.commit_step = [-1] * G
        self.commit_step_in_block = [-1] * G
        self.first_confidence = [math.nan] * G
        self.steps_per_block = [0] * c.num_blocks

    @property
    def block_bounds(self) -> tuple[int, int]:
        """The current block inside the generated region."""
        bl = self.config.block_length
        return self.block * bl, (self.block + 1) * bl

    def forward_mode(self) -> str:
        """This step's forward: a full one at the block start and every f steps (a refresh);
        the cache mode's forward otherwise (decode/forward_modes.py; full without a cache)."""
        own = policy_spec(self.config.policy).forward
        if own is not None:  # a decoder with a forward of its own (WINO's verify forward)
            return own
        t, cache = self.step, CACHE_MODES[self.config.cache]
        refresh = t < cache.refreshes_at_start or (self.refresh_every > 0 and t % self.refresh_every == 0)
        return (ForwardMode.FULL if refresh else cache.between_refreshes).value

    @property
    def step_limit(self) -> int:
        """Steps a block may take; its last commits whatever is left. A decoder that re-masks
        (WINO) may need more than the schedule's T."""
        c = self.config
        return c.wino_max_steps if policy_spec(c.policy).revises else c.steps_per_block

    def dkv_columns(self) -> list[int]:
        """dKV-Cache's computed positions of the generated region: the still-masked ones and those
        committed at the previous step (their K/V are cached one step late)."""
        recent = set(self.last_committed)
        return [p for p, token in enumerate(self.generated) if token is None or p in recent]

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

    def record(self, commits: list[bool], tokens: list[int], confidences: list[float], computed_pairs: int,
               eos_ids: set[int], eos_id: int, device) -> CommitEvent:
        """Host bookkeeping of one step of this request (its block's commits, every position's
        predicted token and confidence): traces, counters, block and answer progress."""
        block_start, block_end = self.block_bounds
        t = self.step
        if t == 0:
            self.first_confidence[block_start:block_end] = confidences
        positions = [block_start + j for j, committed in enumerate(commits) if committed]
        committed_tokens = [tokens[p - block_start] for p in positions]
        global_step = self.steps_before_block + t
        self.last_committed = positions
        for p, token in zip(positions, committed_tokens):
            self.generated[p] = token
            self.commit_step[p] = global_step
            self.commit_step_in_block[p] = t
        self.nfe += 1
        self.computed_pairs += computed_pairs
        self.steps_per_block[self.block] += 1
        if positions and self.first_commit_at is None:
            self.first_commit_at = time.perf_counter()
        event = CommitEvent(self.id, self.block, t, positions, committed_tokens,
                            [self.first_confidence[p] for p in positions])
        block_done = all(x is not None for x in self.generated[block_start:block_end])
        self.step += 1
        self.advance_prefix(eos_ids)
        if self.config.early_stop and self.answer_end is not None:
            self.fill_after_end(eos_id)
            self.early_stopped = True
            event.finished = True
        elif block_done:
            self.steps_before_block += self.steps_per_block[self.block]
            self.block, self.step = self.block + 1, 0
            if self.block == self.config.num_blocks:
                event.finished = True
            else:
                self.start_block(device)
        event.prefix_length = self.prefix
        return event

    def result(self, lm, policy_seconds_now: float) -> GenerationResult:
        """The GenerationResult of this finished request (policy time: the engine's since admission)."""
        return result_of(lm, self, policy_seconds_now - self.policy_seconds_at_admission)
