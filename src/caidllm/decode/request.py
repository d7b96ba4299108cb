"""One request in the step-level engine: what it asked for, where it is, and
what it has produced so far (its own bookkeeping, step by step, and its
result); and the events the engine reports for it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from caidllm.decode import elastic
from caidllm.decode.block_diffusion import Layout, editing_block_done
from caidllm.decode.config import DecodeConfig
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.logprobs import CommitLogprobs
from caidllm.decode.policies import Policy, policy_spec, random_order
from caidllm.decode.results import GenerationResult, result_of
from caidllm.models.modes import Full, SubBlock


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
    elastic: elastic.ElasticState | None = None  # cache mode "elastic" only (decode/elastic.py)
    order_generator: torch.Generator | None = None  # an ordered policy's (policies/random_order.py)
    commit_order: list[int] | None = None  # its block's decoding order
    block_causal: bool = False  # a block-diffusion model's request: blocks laid from the prompt's start
    post_steps: int = 0  # token editing: steps run on the current block since its last mask went
    # The prefix store (decode/prefix_reuse.py): prompt positions whose keys and values came from it, the
    # store's blocks this request holds until it leaves, and its complete blocks with final keys and values.
    reused: int = 0
    pinned: list[bytes] = field(default_factory=list)
    final_blocks: int = 0
    constraint: object | None = None  # structured output: its CanvasConstraint (decode/constraints/)
    logprobs: CommitLogprobs | None = None  # committed tokens' logprobs, when asked for (decode/logprobs.py)

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
        """This step's forward: a full one at the block start and every f steps (a refresh);
        the cache mode's forward otherwise (decode/forward_modes.py; full without a cache).
        An exact cache (block diffusion's) is never refreshed: one full forward, the request's first."""
        own = policy_spec(self.config.policy).forward
        if own is not None:  # a decoder with a forward of its own (WINO's verify forward)
            return own
        t, cache = self.step, CACHE_MODES[self.config.cache]
        if cache.exact:  # with blocks from the prefix store the first forward is a block forward too
            refresh = self.block == 0 and t == 0 and not self.reused
            if not refresh and cache.within_block and self.sub_block_cached():
                return SubBlock.name
        else:
            refresh = t < cache.refreshes_at_start or (self.refresh_every > 0 and t % self.refresh_every == 0)
        return (Full if refresh else cache.between_refreshes).name

    def current_sub_block(self) -> int:
        """Block position where the first sub-block that still holds a mask starts."""
        block_start, block_end = self.block_bounds
        first = next((p - block_start for p in range(max(block_start, 0), block_end) if self.generated[p] is None),
                     block_end - block_start - 1)
        return first - first % self.config.sub_block

    def sub_block_cached(self) -> bool:
        """Whether Fast-dLLM v2's within-block cache serves this step: the block has had a whole forward
        with its first position known (a block whose first position is generated spends its first step
        on that position alone), and the current sub-block's first position is decoded."""
        block_start = self.block_bounds[0]
        if self.step <= int(block_start >= 0):
            return False
        first = block_start + self.current_sub_block()
        return first < 0 or self.generated[first] is not None

    def fold(self) -> int:
        """Positions left of the block that this step's forward recomputes: the previous block,
        whose final keys/values the exact block cache writes at the next block's first step; at the
        first step of a request that took blocks from the prefix store, the prompt positions after them."""
        if not CACHE_MODES[self.config.cache].exact or self.step:
            return 0
        if self.block:
            return self.config.block_length
        return len(self.prompt) - self.layout.lead - self.reused if self.reused else 0

    @property
    def step_limit(self) -> int:
        """Steps a block may take; its last commits whatever is left. A decoder that re-masks
        (WINO) may need more than the schedule's T."""
        c = self.config
        return c.wino_max_steps if policy_spec(c.policy).revises else c.steps_per_block

    def dkv_columns(self) -> list[int]:
        """dKV-Cache's computed positions of the generated region. Decode: the still-masked ones and
        those committed at the previous step (their K/V are cached one step late). Greedy: the ones
        this step decodes, those the previous step decoded, and up to `dkv_window` still-masked
        neighbours of each (nearest first, left then right; masked as of the previous step)."""
        recent = set(self.last_committed)
        if self.config.cache != "dkv-greedy":
            return [p for p, token in enumerate(self.generated) if token is None or p in recent]
        now, before = self.scheduled(self.step), self.scheduled(self.step - 1)
        chosen = set(now) | set(before)
        masked = {p for p, token in enumerate(self.generated) if token is None} | recent
        for p in now:
            chosen |= set(nearest_masked(p, masked - chosen, self.config.dkv_window, len(self.generated)))
        return sorted(chosen)

    def scheduled(self, step: int) -> list[int]:
        """The generated positions an ordered policy decodes at `step` of the current block."""
        block_start, block_end = self.block_bounds
        order = random_order.scheduled(self.commit_order, block_end - block_start, step, self.config.steps_per_block)
        return [block_start + b for b in order]

    def commit_only(self) -> set[int] | None:
        """The block positions this step may commit (None: any masked one): an ordered policy's share of
        its order, Elastic-Cache's window between refreshes."""
        if self.commit_order is not None:
            return {p - self.block_bounds[0] for p in self.scheduled(self.step)}
        if self.elastic is not None:  # the window, at every step (the official loop decodes nothing else)
            return {c - len(self.prompt) - self.block_bounds[0] for c in self.elastic_columns()[2]}
        return None

    def elastic_untrackable(self) -> list[int]:
        """Elastic-Cache's columns its tracked set leaves out (relative): the still-masked ones."""
        return elastic.untrackable(self.generated, len(self.prompt))

    def elastic_columns(self) -> tuple[list[int], list[int], list[int]]:
        """Elastic-Cache's computed columns, the columns whose logits it returns and its window (the
        positions it decodes), relative to the row's first real column (decode/elastic.py). A block's
        first forward computes every column and returns the whole block's logits (CAI reads them)."""
        self.elastic.enter_block(self.block)
        size = self.config.elastic_window or elastic.DEFAULT_WINDOW  # None: 16, cut to the block when shorter
        p = len(self.prompt)
        predicted = elastic.window(self.generated, self.block_bounds, size, self.step == self.step_limit - 1)
        window = [p + q for q in predicted]
        if self.step == 0:
            return list(range(p + len(self.generated))), [p + b for b in range(*self.block_bounds)], window
        return elastic.columns(self.elastic, p, predicted, self.last_committed), window, window

    def start_block(self, device) -> None:
        self.state = {name: torch.zeros(1, dtype=torch.long, device=device) for name in self.state_names}
        if self.order_generator is not None:
            self.commit_order = random_order.block_order(self.order_generator, self.config.block_length)

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
               eos_ids: set[int], eos_id: int, device, edits: list[bool] | None = None) -> CommitEvent:
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
        global_step = self.steps_before_block + t
        self.last_committed = positions
        for p, token in zip(positions, committed_tokens):
            self.generated[p] = token
            self.commit_step[p] = global_step
            self.commit_step_in_block[p] = t
        if self.elastic is not None and self.config.elastic_scope == "generation" and self.config.early_stop \
                and self.elastic.cut is None:  # Elastic-Cache's own stop: nothing after its first end token
            self.elastic.cut = elastic.cut_at_end_token(self.generated, positions, eos_ids, eos_id)
        self.nfe += 1
        self.computed_pairs += computed_pairs
        self.steps_per_block[self.block] += 1
        if positions and self.first_commit_at is None:
            self.first_commit_at = time.perf_counter()
        edited = [block_start + j for j, e in enumerate(edits or ()) if e and not commits[j]] if editing else []
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
        event = CommitEvent(self.id, self.block, t, reported, [committed_tokens[i] for i in shown],
                            [self.first_confidence[p] for p in reported], block_start=block_start,
                            logprobs=None if self.logprobs is None else self.logprobs.take(reported, block_start))
        self.step += 1
        if block_done or not editing:  # an editing request's answer grows only by final blocks
            self.advance_prefix(eos_ids)
        if self.config.early_stop and self.answer_end is not None:
            self.fill_after_end(eos_id)
            self.early_stopped = True
            event.finished = True
        elif block_done:
            self.steps_before_block += self.steps_per_block[self.block]
            self.block, self.step, self.post_steps = self.block + 1, 0, 0
            if self.block == self.layout.num_blocks:
                event.finished = True
            else:
                self.start_block(device)
        event.prefix_length = min(self.prefix, self.config.gen_length)
        return event

    def result(self, lm, policy_seconds_now: float) -> GenerationResult:
        """The GenerationResult of this finished request (policy time: the engine's since admission)."""
        return result_of(lm, self, policy_seconds_now - self.policy_seconds_at_admission)


def nearest_masked(position: int, masked: set[int], size: int, length: int) -> list[int]:
    """Up to `size` of the `masked` positions nearest `position`, looking left and right in turn."""
    found, left, right, look_left = [], position - 1, position + 1, True
    while len(found) < size and (left >= 0 or right < length):
        if look_left:
            if left in masked:
                found.append(left)
            left -= 1
        else:
            if right < length and right in masked:
                found.append(right)
            right += 1
        look_left = not look_left
    return found
