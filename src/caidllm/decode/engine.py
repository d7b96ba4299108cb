"""The step-level engine: every denoising loop of caidllm runs here.

Requests are submitted (queued), admitted into a free slot of the shared
Frame at the next step, and leave as soon as they finish or are cancelled.
One call of `step()` advances every in-flight request by exactly one
denoising step of its own block: at each step a request runs one forward
(a full forward without a cache, at its block start and every f steps; its
cached mode otherwise), each masked position of its block gets a predicted
token and its confidence, its policy picks which to commit, and the step's
commits are reported as a CommitEvent.

Who shares a forward: the requests whose forward this step has the same mode
("full", "prefix", "dual" or "es" with the same skip schedule) and the same
block length. They may differ in prompt length, block, local step, method,
gen_length and sampling: each row is computed as it would be alone (its own
columns, its own cache row). Requests that cannot share run in separate
forwards within the same step, so no request waits for another's block to
end. Inside a forward, the commit policy runs once per group of rows with the
same policy settings, step and block (policies are batched tensor functions
of the rows they are given); prediction once per temperature.

A new request's first forward is the refresh of its first block: admitting
it writes only its own slot. Limits: `max_batch` requests in flight (so at
most that many rows per forward) and `max_queue` waiting; past both,
`submit` raises EngineFullError.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import uuid
from collections import OrderedDict, defaultdict, deque
from typing import Iterator

import torch

from caidllm.decode.block_diffusion import Layout, editing_block_done, edits, fit_to_model
from caidllm.decode.config import DecodeConfig
from caidllm.decode.frame import Frame
from caidllm.decode.policies import StepView, make_policy
from caidllm.decode.request import CommitEvent, Request
from caidllm.decode.results import result_of
from caidllm.decode.sampling import predict, request_generator
from caidllm.errors import EngineFullError, InputError
from caidllm.models import transfer
from caidllm.models.skip import EarlySkip
from caidllm.models.transfer import to_device


class DeviceTimer:
    """Time spent in a part of the step (the commit policy, the model forwards). On CUDA,
    events around each call are read at the end, so the timing adds no host sync to the step
    (events already passed, as they are after the step's transfer, are read without one)."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.seconds = 0.0
        self.events: list = []

    def __enter__(self):
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._tick = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.seconds += time.perf_counter() - self._tick

    def total(self) -> float:
        if self.cuda:
            if not all(end.query() for _, end in self.events):
                torch.cuda.synchronize()
            self.seconds += sum(start.elapsed_time(end) for start, end in self.events) / 1000
            self.events.clear()
        return self.seconds


class Engine:
    def __init__(self, lm, max_batch: int = 8, max_queue: int = 256):
        for name, value, low in (("max_batch", max_batch, 1), ("max_queue", max_queue, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
        self.lm = lm
        self.max_batch, self.max_queue = max_batch, max_queue
        self.frame = Frame(lm, max_batch)
        self.queue: deque[Request] = deque()
        self.running: OrderedDict[str, Request] = OrderedDict()  # in admission order
        self._finished_ids: deque[str] = deque(maxlen=4096)  # for a clear error on a late cancel
        self.policy_timer = DeviceTimer(lm.device)
        self.forward_timer = DeviceTimer(lm.device)  # time inside the model forwards
        self.forwards = 0  # forward passes run (one per group per step)
        self.steps = 0
        c = lm.config
        self._eos_ids = set(c.eos_ids)

    # ---- requests in and out -------------------------------------------------

    def submit(self, prompt_ids: list[int], config: DecodeConfig, request_id: str | None = None) -> str:
        """Queue a tokenised prompt; it joins the running batch at the next step.
        Everything is checked here, before anything is queued."""
        request = self.prepare(prompt_ids, config, request_id)
        if request.id in self.running or any(r.id == request.id for r in self.queue):
            raise InputError(f"request id {request.id!r} is already in the engine")
        if len(self.running) + len(self.queue) >= self.max_batch + self.max_queue:
            raise EngineFullError(f"the engine is full: {len(self.running)} requests in flight and "
                                  f"{len(self.queue)} queued (max_batch {self.max_batch}, max_queue {self.max_queue})")
        self.queue.append(request)
        return request.id

    def prepare(self, prompt_ids: list[int], config: DecodeConfig, request_id: str | None = None) -> Request:
        """A checked Request, not yet queued (touches no engine state: any thread may call it)."""
        if not isinstance(config, DecodeConfig):
            raise InputError(f"config must be a DecodeConfig (see build_config), got {type(config).__name__}")
        config = copy.deepcopy(config).validate()  # the request's own: a caller's later edit cannot reach it
        config = fit_to_model(config, self.lm.config)
        prompt = self._check_prompt(prompt_ids, config)
        request_id = uuid.uuid4().hex if request_id is None else str(request_id)
        return self._new_request(request_id, prompt, config)

    def cancel(self, request_id: str) -> None:
        """Remove a queued or in-flight request now (between steps) and free its slot."""
        for r in self.queue:
            if r.id == request_id:
                self.queue.remove(r)
                return
        r = self.running.pop(request_id, None)
        if r is None:
            state = "already finished" if request_id in self._finished_ids else "unknown"
            raise InputError(f"cannot cancel request {request_id!r}: {state}")
        self.frame.release(r.slot)
        self._finished_ids.append(request_id)

    def drop_running(self) -> list[str]:
        """Drop every in-flight request and start a fresh Frame; their ids. After a step that raised
        this is required: that step may have advanced some groups and not others. Queued requests stay."""
        ids = list(self.running)
        self.running.clear()
        self.frame = Frame(self.lm, self.max_batch)
        self._finished_ids.extend(ids)
        return ids

    def cancel_all(self) -> list[str]:
        """Drop every queued and in-flight request (shutdown); their ids."""
        ids = [r.id for r in self.queue]
        self.queue.clear()
        self._finished_ids.extend(ids)
        return ids + self.drop_running()

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.queue)

    def run(self) -> Iterator[CommitEvent]:
        """Step until every submitted request has finished, yielding each event."""
        while self.has_work:
            yield from self.step()

    # ---- one step ----------------------------------------------------------------

    def step(self) -> list[CommitEvent]:
        """Admit waiting requests into free slots, then advance every in-flight
        request by one denoising step. Returns the step's events."""
        self._admit()
        groups: dict[tuple, list[Request]] = defaultdict(list)
        for r in self.running.values():
            mode = r.forward_mode()
            schedule = (r.config.es_schedule, r.config.es_alpha) if mode == "es" else ()
            groups[(mode, r.config.block_length, schedule, r.fold())].append(r)
        events: list[CommitEvent] = []
        for (mode, _, _, fold), members in groups.items():
            events.extend(self._advance(mode, sorted(members, key=lambda r: r.slot), fold))
        for event in events:
            if event.finished:
                r = self.running.pop(event.request_id)
                self.frame.release(r.slot)
                self._finished_ids.append(r.id)
        self.steps += bool(events)
        return events

    def _advance(self, mode: str, members: list[Request], fold: int = 0) -> list[CommitEvent]:
        lm, frame, device = self.lm, self.frame, self.lm.device
        bl = members[0].config.block_length
        slots = [r.slot for r in members]
        starts = [frame.block_start(r.slot, r.layout.span, r.block_bounds[0]) for r in members]
        slot_ids = to_device(slots, device)  # no host sync on the hot path (models/transfer.py)
        columns = to_device(starts, device)[:, None] + torch.arange(bl, device=device)
        block = frame.canvas[slot_ids[:, None], columns]
        masked = block == lm.config.mask_id
        skip = None
        if mode == "es":
            r0 = members[0].config
            skip = EarlySkip(torch.stack([r.prev_confidence for r in members]),
                             torch.stack([r.just_committed for r in members]), masked, r0.es_schedule, r0.es_alpha)
        # Every request was checked at submit and the Frame knows each row's first real column:
        # the unchecked forward has no host sync.
        with self.forward_timer:
            logits = lm.forward(frame.canvas, frame.attention, mode=mode, cache=frame.cache, start=starts,
                                end=[s + bl for s in starts], rows=frame.row_selector(slots, slot_ids), skip=skip,
                                real_from=[frame.first_real(s) for s in slots],
                                attention_block=bl if lm.config.block_causal else None, fold=fold)
        self.forwards += 1
        predicted, confidence = self._predict(logits, members)
        for i, r in enumerate(members):
            if r.step == 0:
                r.block_first_confidence = confidence[i]
        commit = self._select(members, predicted, confidence, masked)
        edit = edits(members, predicted, confidence, masked, block, columns,
                     [frame.block_start(r.slot, r.layout.span, 0) for r in members])
        changed = commit if edit is None else commit | edit
        frame.canvas[slot_ids[:, None], columns] = torch.where(changed, predicted, block)
        for i, r in enumerate(members):
            if r.config.cache == "es":
                r.prev_confidence, r.just_committed = confidence[i], commit[i]
        pairs = lm.config.n_layers * bl if skip is None else skip.computed_pairs
        # Commits, tokens and confidences of these rows reach the host in one transfer.
        # The step's one host sync per forward group (transfer.to_host).
        commits, tokens, confidences, edited = transfer.to_host(
            torch.stack([commit.double(), predicted.double(), confidence.double(),
                         (commit if edit is None else edit).double()]))
        return [self._record(r, [bool(x) for x in commits[i]], [int(x) for x in tokens[i]], confidences[i], pairs,
                             [bool(x) for x in edited[i]] if edit is not None else None)
                for i, r in enumerate(members)]

    def _predict(self, logits: torch.Tensor, members: list[Request]):
        mask_id = self.lm.config.mask_id
        temperatures = {r.config.temperature for r in members}
        if temperatures == {0}:
            return predict(logits, mask_id, 0.0, None, consume=True)
        predicted = torch.empty(logits.shape[:2], dtype=torch.long, device=logits.device)
        confidence = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
        for temperature in sorted(temperatures):
            idx = [i for i, r in enumerate(members) if r.config.temperature == temperature]
            gens = [members[i].generator for i in idx] if temperature > 0 else None
            at = to_device(idx, logits.device)
            predicted[at], confidence[at] = predict(logits[at], mask_id, temperature, gens, consume=True)
        return predicted, confidence

    def _select(self, members, predicted, confidence, masked) -> torch.Tensor:
        """Each group of rows with the same policy settings, step and block runs its policy once."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, r in enumerate(members):
            groups[(r.policy_key, r.step, r.block)].append(i)
        first = torch.stack([r.block_first_confidence for r in members])
        commit = torch.zeros_like(masked)
        for idx in groups.values():
            r0 = members[idx[0]]
            whole = len(idx) == len(members)
            at = slice(None) if whole else to_device(idx, masked.device)
            state = {name: torch.cat([members[i].state[name] for i in idx]) for name in r0.state_names}
            T = r0.config.steps_per_block
            view = StepView(confidence=confidence[at], predicted=predicted[at], masked=masked[at],
                            first_confidence=first[at], step=r0.step, total_steps=T, block_index=r0.block,
                            rows=torch.arange(len(idx), device=masked.device), state=state)
            with self.policy_timer:
                chosen = r0.policy(view) & view.masked
            if r0.step == T - 1:  # the last step commits whatever is left: no mask ever leaves the engine
                chosen = view.masked
            for j, i in enumerate(idx):
                for name in r0.state_names:
                    members[i].state[name] = state[name][j:j + 1]
            commit[at] = chosen
        return commit

    def _record(self, r: Request, commits: list[bool], tokens: list[int], confidences: list[float],
                pairs: int, edits: list[bool] | None = None) -> CommitEvent:
        """Host bookkeeping of one request's step: traces, counters, block and answer progress.
        edits: the positions an editing request rewrote (LLaDA2.1); its block is streamed when final."""
        gs, ge = r.block_bounds
        t = r.step
        editing = r.config.editing_threshold is not None
        started_masked = any(x is None for x in r.generated[max(gs, 0):ge])
        if t == 0:
            for p in range(max(gs, 0), ge):  # block diffusion: the block may start inside the prompt
                r.first_confidence[p] = confidences[p - gs]
        positions = [gs + j for j, c in enumerate(commits) if c]
        committed = [tokens[p - gs] for p in positions]
        global_step = r.steps_before_block + t
        for p, token in zip(positions, committed):
            r.generated[p] = token
            r.commit_step[p] = global_step
            r.commit_step_in_block[p] = t
        r.nfe += 1
        r.computed_pairs += pairs
        r.steps_per_block[r.block] += 1
        if positions and r.first_commit_at is None:
            r.first_commit_at = time.perf_counter()
        edited = [gs + j for j, e in enumerate(edits or ()) if e and not commits[j]] if editing else []
        for p in edited:
            r.generated[p] = tokens[p - gs]
        if editing:
            block_done = editing_block_done(r, started_masked, bool(edited))
            positions = list(range(max(gs, 0), ge)) if block_done else []  # streamed once final
            committed = [r.generated[p] for p in positions]
        else:
            block_done = all(x is not None for x in r.generated[max(gs, 0):ge])
        # Positions past gen_length (the end of block diffusion's last block) are decoded, never reported.
        shown = [i for i, p in enumerate(positions) if p < r.config.gen_length]
        event = CommitEvent(r.id, r.block, t, [positions[i] for i in shown], [committed[i] for i in shown],
                            [r.first_confidence[positions[i]] for i in shown])
        event.block_start = gs
        r.step += 1
        if block_done or not editing:  # an editing request's answer grows only by final blocks
            r.advance_prefix(self._eos_ids)
        if r.config.early_stop and r.answer_end is not None:
            r.fill_after_end(self.lm.config.eos_id)
            r.early_stopped = True
            event.finished = True
        elif block_done:
            r.steps_before_block += r.steps_per_block[r.block]
            r.block, r.step, r.post_steps = r.block + 1, 0, 0
            if r.block == r.layout.num_blocks:
                event.finished = True
            else:
                r.start_block(self.lm.device)
        event.prefix_length = min(r.prefix, r.config.gen_length)
        if event.finished:
            event.result = result_of(self.lm, r, self.policy_timer.total() - r.controller_at_admission)
        return event

    # ---- helpers -----------------------------------------------------------------

    def _admit(self) -> None:
        for slot in self.frame.free_slots():
            if not self.queue:
                return
            r = self.queue.popleft()
            c = r.config
            self.frame.place(slot, r.prompt, r.layout.span, cached=c.cache != "none",
                             skip_schedule=c.es_schedule if c.cache == "es" else None)
            r.slot, r.admitted_at = slot, time.perf_counter()
            r.controller_at_admission = self.policy_timer.total()
            r.start_block(self.lm.device)
            self.running[r.id] = r

    def _new_request(self, request_id: str, prompt: list[int], config: DecodeConfig) -> Request:
        lm = self.lm
        gating = lm.config.confidence_gating if config.cai.gating is None else config.cai.gating
        refresh_every = lm.config.cache_refresh_every if config.refresh_every is None else config.refresh_every
        policy, state_names = make_policy(config, gating)
        policy_key = (config.policy, config.threshold, config.factor, config.num_to_transfer,
                      dataclasses.astuple(config.cai), gating,
                      config.steps_per_block)
        generator = request_generator(config.seed, prompt, lm.device) if config.temperature > 0 else None
        return Request(request_id, prompt, config, gating, refresh_every, policy, state_names, policy_key, generator,
                       block_causal=lm.config.block_causal)

    def _check_prompt(self, prompt_ids, config: DecodeConfig) -> list[int]:
        c = self.lm.config
        if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids):
            raise InputError(f"a prompt must be a non-empty list of token ids, got {prompt_ids!r:.80}")
        bad = [t for t in prompt_ids if not 0 <= t < c.vocab_size]
        if bad:
            raise InputError(f"token id {bad[0]} is outside the vocabulary [0, {c.vocab_size})")
        span = Layout.of(len(prompt_ids), config, c.block_causal).span
        if len(prompt_ids) + span > c.max_length:
            laid = "" if span == config.gen_length else f", laid out to the end of its last block: {span}"
            raise InputError(
                f"prompt ({len(prompt_ids)} tokens) + gen_length ({config.gen_length}{laid}) = "
                f"{len(prompt_ids) + span} exceeds the model's context of {c.max_length} tokens")
        return list(prompt_ids)
