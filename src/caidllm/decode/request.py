"""One request in the step-level engine: what it asked for, where it is, and
what it has produced so far (its own bookkeeping, step by step, and its
result); and the events the engine reports for it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from caidllm.decode.block_diffusion import Layout, editing_block_done
from caidllm.decode.caches.base import CacheMode
from caidllm.decode.config import DecodeConfig
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.logprobs import CommitLogprobs
from caidllm.decode.policies import Policy
from caidllm.decode.policies.base import PolicyState
from caidllm.decode.results import GenerationResult, result_of


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
    # A request's first event, when the prefix store applies to it: prompt positions whose keys and values
    # came from the store (decode/prefix_reuse.py; 0 when none did), and its prompt length. Else None.
    reused_positions: int | None = None
    prompt_length: int | None = None
    # With logprobs asked for: per committed position, (its token's logprob, [(token, logprob)] of the best).
    logprobs: list | None = None
    # The uniform-state decoders with stream_draft: the step's draft (decode/uniform_engine.py, _draft).
    draft: dict | None = None
    forwards: int = 1  # forward passes the step ran for this request (S2D2's verify forward: 2)


@dataclass
class Request:
    """Per-request state: what every request has. Tokens, traces and counters live on the host (they
    are read every step for the events anyway); the canvas row and the KV cache row live in the
    engine's Frame, at ``slot``; the policy's state tensors are small device tensors. A policy or a
    cache mode that needs memory of its own keeps it in its own object, made for the request:
    ``policy_state`` (PolicySpec.new_state) and ``cache_state`` (CacheMode.new_state)."""

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
    # generated positions committed at the previous step
    last_committed: list[int] = field(default_factory=list)
    policy_state: PolicyState | None = None  # the policy's own memory (PolicySpec.new_state)
    cache_state: object | None = None  # the cache mode's own memory (CacheMode.new_state)
    block_causal: bool = False  # a block-diffusion model's request: blocks laid from the prompt's start
    # The prefix store (decode/prefix_reuse.py): prompt positions whose keys and values came from it, the
    # store's blocks this request holds until it leaves, and its complete blocks with final keys and values.
    reused: int = 0
    pinned: list[bytes] = field(default_factory=list)
    final_blocks: int = 0
    constraint: object | None = None  # structured output: its CanvasConstraint (decode/constraints/)
    logprobs: CommitLogprobs | None = None  # committed tokens' logprobs, when asked for (decode/logprobs.py)

    def __post_init__(self):
        self.cache_mode: CacheMode = CACHE_MODES[self.config.cache]
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

    @property
    def step_limit(self) -> int:
        """Steps a block may take; its last commits whatever is left (the policy says how many)."""
        return self.config.policy_settings.step_limit(self.config)

    def commit_only(self) -> set[int] | None:
        """The block positions this step may commit (None: any masked one): the policy's say (an ordered
        policy's share of its order), else the cache mode's (Elastic-Cache's window)."""
        own = self.policy_state.commit_only(self) if self.policy_state is not None else None
        return own if own is not None else self.cache_mode.commit_only(self)

    def start_block(self, device) -> None:
        self.state = {name: torch.zeros(1, dtype=torch.long, device=device) for name in self.state_names}
        if self.policy_state is not None:
            self.policy_state.start_block(self)

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

    def record(
        self,
        commits: list[bool],
        tokens: list[int],
        confidences: list[float],
        computed_pairs: int,
        eos_ids: set[int],
        eos_id: int,
        device,
        edits: list[bool] | None = None,
    ) -> CommitEvent:
        """Host bookkeeping of one step of this request (its block's commits, every position's
        predicted token and confidence): traces, counters, block and answer progress.
        edits: the positions an editing request rewrote (LLaDA2.1); its block is streamed when final."""
        block_start, block_end = self.block_bounds
        answer_from = max(block_start, 0)  # block diffusion: the block may start inside the prompt
        t = self.step
        editing = self.config.editing_threshold is not None
        started_masked = any(x is None for x in self.generated[answer_from:block_end])
        if t == 0:
            for p in range(answer_from, block_end):
                self.first_confidence[p] = confidences[p - block_start]
        positions = [block_start + j for j, committed in enumerate(commits) if committed]
        committed_tokens = [tokens[p - block_start] for p in positions]
        self._commit(positions, committed_tokens, computed_pairs, eos_ids, eos_id)
        edited = (
            [block_start + j for j, e in enumerate(edits or ()) if e and not commits[j]] if editing else []
        )
        for p in edited:
            self.generated[p] = tokens[p - block_start]
        if editing:
            block_done = editing_block_done(self, started_masked, bool(edited))
            positions = list(range(answer_from, block_end)) if block_done else []  # streamed once final
            committed_tokens = [self.generated[p] for p in positions]
        else:
            block_done = all(x is not None for x in self.generated[answer_from:block_end])
        # Positions past gen_length (the end of block diffusion's last block) are decoded, never reported.
        shown = [i for i, p in enumerate(positions) if p < self.config.gen_length]
        reported = [positions[i] for i in shown]
        event = CommitEvent(
            self.id,
            self.block,
            t,
            reported,
            [committed_tokens[i] for i in shown],
            [self.first_confidence[p] for p in reported],
            block_start=block_start,
            logprobs=None if self.logprobs is None else self.logprobs.take(reported, block_start),
        )
        self.step += 1
        self._move_on(event, block_done, editing, eos_ids, eos_id, device)
        return event

    def _commit(
        self, positions: list[int], tokens: list[int], computed_pairs: int, eos_ids: set[int], eos_id: int
    ) -> None:
        """This step's commits written into the answer with their steps, and its counters."""
        t = self.step
        global_step = self.steps_before_block + t
        self.last_committed = positions
        for p, token in zip(positions, tokens):
            self.generated[p] = token
            self.commit_step[p] = global_step
            self.commit_step_in_block[p] = t
        self.cache_mode.after_record(self, positions, eos_ids, eos_id)
        self.nfe += 1
        self.computed_pairs += computed_pairs
        self.steps_per_block[self.block] += 1
        if positions and self.first_commit_at is None:
            self.first_commit_at = time.perf_counter()

    def _move_on(
        self, event: CommitEvent, block_done: bool, editing: bool, eos_ids: set[int], eos_id: int, device
    ) -> None:
        """After a step: the answer's prefix, an early end after its EOS, or the next block (or the end)."""
        if block_done or not editing:  # an editing request's answer grows only by final blocks
            self.advance_prefix(eos_ids)
        if self.config.early_stop and self.answer_end is not None:
            self.fill_after_end(eos_id)
            self.early_stopped = True
            event.finished = True
        elif block_done:
            self.steps_before_block += self.steps_per_block[self.block]
            self.block, self.step = self.block + 1, 0
            if self.block == self.layout.num_blocks:
                event.finished = True
            else:
                self.start_block(device)
        event.prefix_length = min(self.prefix, self.config.gen_length)

    def finish_with(self, fill: dict[int, int], event: CommitEvent, eos_ids: set[int], eos_id: int) -> None:
        """The policy ended the request at this step (Prophet's early exit): every position still masked takes
        the fill's token, committed at this step; the event reports them and finishes the request."""
        step = self.nfe - 1  # this step's global index (one forward per step)
        filled = [p for p, token in enumerate(self.generated) if token is None]
        for p in filled:
            self.generated[p], self.commit_step[p] = fill[p], step
        shown = [p for p in filled if p < self.config.gen_length]
        event.positions += shown
        event.token_ids += [self.generated[p] for p in shown]
        event.first_confidence += [self.first_confidence[p] for p in shown]
        self.advance_prefix(eos_ids)
        if self.config.early_stop and self.answer_end is not None:
            self.fill_after_end(eos_id)
        event.finished, event.prefix_length = True, min(self.prefix, self.config.gen_length)

    def result(self, lm, policy_seconds_now: float) -> GenerationResult:
        """The GenerationResult of this finished request (policy time: the engine's since admission)."""
        return result_of(lm, self, policy_seconds_now - self.policy_seconds_at_admission)
