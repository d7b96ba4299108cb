"""The step engine of the sequential decoders (decode/nemotron.py: ar, nemotron-dlm, linear-spec) for the
server: the interface BackgroundEngine drives (prepare, a scheduler with its limits, step, cancel), each
request its own decoder generator over its own KV cache (`stepper`). A step advances every running
request by one iteration of its decoder (a token, a block, or a draft and verify) and emits one
CommitEvent per request: the tokens decided since its last event, the last one with the result. Requests
never share a forward, so a request's tokens do not depend on who else is in flight.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import torch

from caidllm.checks import is_id_list
from caidllm.decode.nemotron import SequentialSettings, result_of, stepper
from caidllm.decode.request import CommitEvent
from caidllm.decode.scheduler import Scheduler
from caidllm.errors import InputError


@dataclass
class SequentialRequest:
    id: str
    prompt: list[int]
    settings: SequentialSettings
    steps: object  # the decoder's generator (decode/nemotron.py: stepper)
    sent: int = 0  # tokens already in events
    iteration: int = 0
    admitted_at: float = field(default_factory=time.perf_counter)


class SequentialScheduler:
    """The queue and the limits (BackgroundEngine checks room against it and hands it its inbox)."""

    def __init__(self, max_batch: int, max_queue: int):
        self.max_batch, self.max_queue = max_batch, max_queue
        self.queue: deque[SequentialRequest] = deque()
        self.running: dict[str, SequentialRequest] = {}

    # the step engine's rules, read from its scheduler (the same attributes: queue, running, the limits)
    capacity = Scheduler.capacity
    check_room = Scheduler.check_room
    add_checked = Scheduler.add_checked
    queued = Scheduler.queued
    in_flight = Scheduler.in_flight


@dataclass
class _Counter:
    forwards: int = 0


@dataclass
class _NoStore:
    store: object = None


class SequentialEngine:
    def __init__(self, lm, max_batch: int = 8, max_queue: int = 256):
        self.lm = lm
        self.scheduler = SequentialScheduler(max_batch, max_queue)
        self.runner, self.prefix = _Counter(), _NoStore()
        self.steps = 0

    @property
    def has_work(self) -> bool:
        return bool(self.scheduler.queue or self.scheduler.running)

    def prepare(
        self, prompt_ids, config, request_id=None, constraint=None, logprobs=None
    ) -> SequentialRequest:
        """A checked request (InputError naming the field): config is the SequentialSettings the server
        built (serve/protocol.py); structured output and logprobs are not implemented for these decoders."""
        if not isinstance(config, SequentialSettings):
            raise InputError(f"settings must be SequentialSettings, got {type(config).__name__}")
        for name, value in (("response_format", constraint), ("logprobs", logprobs)):
            if value is not None:
                raise InputError(f"{name}: not implemented for the sequential decoders ({config.method})")
        c = self.lm.config
        if not is_id_list(prompt_ids) or any(not 0 <= t < c.vocab_size for t in prompt_ids):
            raise InputError(f"a prompt must be a non-empty list of token ids in [0, {c.vocab_size})")
        if len(prompt_ids) + config.gen_length + config.block_length > c.max_length:
            raise InputError(
                f"prompt ({len(prompt_ids)} tokens) + gen_length + block_length exceeds the model's "
                f"context of {c.max_length}"
            )
        rid = uuid.uuid4().hex if request_id is None else str(request_id)
        return SequentialRequest(rid, list(prompt_ids), config, stepper(self.lm, list(prompt_ids), config))

    def submit(self, prompt_ids, config, request_id=None) -> str:
        request = self.prepare(prompt_ids, config, request_id)
        self.scheduler.check_room(request.id, request.id in self.scheduler.running, self.held)
        self.scheduler.queue.append(request)
        return request.id

    @property
    def held(self) -> int:
        return len(self.scheduler.queue) + len(self.scheduler.running)

    def cancel(self, request_id: str) -> None:
        self.scheduler.running.pop(request_id, None)
        self.scheduler.queue = deque(r for r in self.scheduler.queue if r.id != request_id)

    def cancel_all(self) -> list[str]:
        ids = [*self.scheduler.running, *(r.id for r in self.scheduler.queue)]
        self.scheduler.running.clear()
        self.scheduler.queue.clear()
        return ids

    def drop_running(self) -> list[str]:
        ids = list(self.scheduler.running)
        self.scheduler.running.clear()
        return ids

    def take_faults(self) -> dict:
        return {}

    def run(self):
        while self.has_work:
            yield from self.step()

    @torch.no_grad()
    def step(self) -> list[CommitEvent]:
        """Admit waiting requests into free slots, advance each running one by one iteration."""
        while self.scheduler.queue and len(self.scheduler.running) < self.scheduler.max_batch:
            request = self.scheduler.queue.popleft()
            self.scheduler.running[request.id] = request
        events = [self._advance(r) for r in list(self.scheduler.running.values())]
        self.steps += 1
        self.runner.forwards += len(events)
        return events

    def _advance(self, r: SequentialRequest) -> CommitEvent:
        r.iteration += 1
        try:
            tokens, done = list(next(r.steps)), None
        except StopIteration as stop:
            done = stop.value
            tokens = list(done.tokens)
        tokens = tokens[: r.settings.gen_length]  # linear-spec's last verify may pass it (cut, as the result)
        eos = set(self.lm.config.eos_ids)
        answer = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
        event = CommitEvent(
            request_id=r.id,
            block=r.iteration - 1,
            step=0,
            positions=list(range(r.sent, len(tokens))),
            token_ids=tokens[r.sent :],
            first_confidence=[float("nan")] * (len(tokens) - r.sent),
            prefix_length=answer,
        )
        r.sent = len(tokens)
        if done is not None:
            del self.scheduler.running[r.id]
            event.finished = True
            event.result = result_of(self.lm, r.prompt, r.settings, done, time.perf_counter() - r.admitted_at)
        return event
