"""The step-level engine of the uniform-state family (DiffusionGemma): submit, step, run, cancel, with
continuous batching. A request is admitted at the next step into a free slot (its prompt encoded into
its own cache then), every running canvas advances one denoising step per `step()` in one batched
decoder forward, a canvas that ends is appended to its request's answer, encoded into its cache, and the
next canvas starts at the next step. A request leaves as soon as it is done (an end token in a canvas, or
its canvases all decoded). Each request draws from its own generator: its tokens do not depend on who
shares its forwards (alone, batched, or joining mid-flight).

Events are the mask engine's CommitEvent: one per request and step; a step that ends a canvas carries
that canvas's positions and tokens (the stream of finished canvases), the last one the result; with
`stream_draft` every event also carries the step's draft (the argmax canvas, the accepted positions and
the tokens they kept).

It answers the calls BackgroundEngine makes of the mask engine (prepare, scheduler.check_room /
add_checked, step, cancel, drop_running, take_faults, forwards, prefix_store), so the server's engine
thread drives either engine.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from caidllm.checks import is_id_list
from caidllm.decode.diffusiongemma_sampler import denoise_step
from caidllm.decode.diffusiongemma_settings import DiffusionGemmaSettings
from caidllm.decode.diffusiongemma_state import CanvasRequest
from caidllm.decode.request import CommitEvent
from caidllm.decode.results import GenerationResult, Trace
from caidllm.decode.sampling import request_generator
from caidllm.decode.scheduler import Limits
from caidllm.decode.timing import DeviceTimer
from caidllm.errors import EngineFullError, InputError
from caidllm.models.diffusion_gemma_cache import DGCache


class UniformEngine:
    """Under --tp, rank 0's mirror (parallel/mirror.py) sends the other ranks its inputs before each step."""

    def __init__(self, lm, max_batch: int = 8, max_queue: int = 256):
        self.lm = lm
        self.scheduler = Limits(max_batch, max_queue)  # the queue and its limits, as the mask engine's
        self.forwards = 0  # decoder forwards (one per step)
        self.steps = 0
        self.prefix_store = None  # no prefix store for this family
        # where a step's time goes (bench's Fwd and Ctrl columns): the encoder and decoder forwards, and the
        # rest of denoise_step (drawing, the acceptance rule, renoising)
        self.forward_timer = DeviceTimer(lm.device)
        self.policy_timer = DeviceTimer(lm.device)
        self.mirror = getattr(lm, "mirror", None)  # a tensor-parallel model's rank 0
        if self.mirror is not None:
            self.mirror.attach(self)

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @property
    def queue(self) -> deque:
        return self.scheduler.queue

    @property
    def running(self) -> dict:
        return self.scheduler.running

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def canvas_length(self) -> int:
        return self.lm.model.shape.canvas_length

    def submit(
        self, prompt_ids: list[int], settings: DiffusionGemmaSettings, request_id: str | None = None
    ) -> str:
        request = self.prepare(prompt_ids, settings, request_id)
        if len(self.queue) >= self.scheduler.max_queue:
            raise EngineFullError(f"the queue is full ({self.scheduler.max_queue} requests waiting)")
        self.queue.append(request)
        return request.id

    def prepare(
        self, prompt_ids, settings: DiffusionGemmaSettings, request_id=None, constraint=None, logprobs=None
    ) -> CanvasRequest:
        """A checked request (InputError naming the field), not queued yet. constraint and logprobs: the
        mask engine's options, not implemented for the uniform-state decoders (refused when given)."""
        if not isinstance(settings, DiffusionGemmaSettings):
            raise InputError(
                f"the uniform-state engine decodes with DiffusionGemmaSettings, got {type(settings).__name__}"
                + (f" of method {settings.method!r}" if hasattr(settings, "method") else ""),
                "method",
            )
        for name, value in (("constraint", constraint), ("logprobs", logprobs)):
            if value is not None:
                raise InputError(
                    f"{name} is not implemented for the uniform-state decoders (structured output and "
                    "logprobs read a mask-based decoder's commits)",
                    name,
                )
        c, L = self.lm.config, self.canvas_length
        settings.validate(L)
        if not is_id_list(prompt_ids):
            raise InputError(
                f"a prompt must be a non-empty list of token ids, got {prompt_ids!r:.80}", "prompt"
            )
        bad = [t for t in prompt_ids if not 0 <= t < c.vocab_size]
        if bad:
            raise InputError(f"token id {bad[0]} is outside the vocabulary [0, {c.vocab_size})", "prompt")
        image = self.lm.model.shape.image_token_id
        if image is not None and image in prompt_ids:
            raise InputError(
                "the prompt holds image tokens: DiffusionGemma's vision tower is not loaded "
                "(caidllm runs its text path only)",
                "prompt",
            )
        canvases = math.ceil(settings.gen_length / L)
        if len(prompt_ids) + canvases * L > c.max_length:
            raise InputError(
                f"prompt ({len(prompt_ids)} tokens) + {canvases} canvases of {L} exceeds the "
                f"model's context of {c.max_length} tokens (gen_length {settings.gen_length})",
                "prompt",
            )
        if settings.exact_seed and settings.seed is not None:
            generator = torch.Generator(device=self.lm.device).manual_seed(settings.seed)
        else:
            generator = request_generator(settings.seed, list(prompt_ids), self.lm.device)
        return CanvasRequest(
            id=uuid.uuid4().hex if request_id is None else str(request_id),
            prompt=list(prompt_ids),
            settings=settings,
            generator=generator,
            cache=DGCache.empty(c.n_layers),
            vocab_size=c.vocab_size,
            canvas_length=L,
            canvases_wanted=canvases,
        )

    def cancel(self, request_id: str) -> None:
        if self.mirror is not None:
            self.mirror.record(self, "cancel", request_id)
        self.running.pop(request_id, None)
        self.scheduler.queue = deque(r for r in self.queue if r.id != request_id)

    def cancel_all(self) -> list[str]:
        ids = [*self.running, *(r.id for r in self.queue)]
        if self.mirror is not None:
            self.mirror.record(self, "cancel_all")
        self.running.clear()
        self.queue.clear()
        return ids

    def drop_running(self) -> list[str]:
        """Drop every in-flight request (after a step that raised); their ids. Queued requests stay."""
        if self.mirror is not None:
            self.mirror.record(self, "drop_running")
        ids = list(self.running)
        self.running.clear()
        return ids

    def take_faults(self) -> dict:
        """Requests that failed alone in a step: none here (a step fails or succeeds for every row)."""
        return {}

    def run(self) -> Iterator[CommitEvent]:
        while self.has_work:
            yield from self.step()

    @torch.no_grad()
    def step(self) -> list[CommitEvent]:
        """Admit waiting requests, advance every running canvas by one step; the step's events."""
        if not self.has_work:
            return []
        if self.mirror is not None:  # before admitting: an admission's encoder forward sums over the ranks
            self.mirror.before_step(self)
        while self.queue and len(self.running) < self.scheduler.max_batch:
            self._admit(self.queue.popleft())
        requests = list(self.running.values())
        with self.policy_timer:
            ended = denoise_step(self.lm.model, requests, self._forward_time)
        self.forwards += 1
        self.steps += 1
        events = [self._after_step(r, done) for r, done in zip(requests, ended)]
        if self.mirror is not None:
            self.mirror.after_step(self, events)
        return events

    @torch.no_grad()
    def _admit(self, r: CanvasRequest) -> None:
        device = self.lm.device
        with self.forward_timer:
            self.lm.model.encode(torch.tensor([r.prompt], device=device), r.cache)
        r.encoder_forwards += 1
        r.new_canvas(device)
        self.running[r.id] = r

    @torch.no_grad()
    def _after_step(self, r: CanvasRequest, canvas_ended: bool) -> CommitEvent:
        index = len(r.steps_per_canvas)
        event = CommitEvent(
            request_id=r.id,
            block=index,
            step=r.step - 1,
            positions=[],
            token_ids=[],
            first_confidence=[],
            block_start=index * r.canvas_length,
            prefix_length=r.answer_length,
        )
        if r.settings.stream_draft:
            event.draft = _draft(r, index)
        if not canvas_ended:
            return event
        tokens = r.argmax.tolist()
        eos = set(self.lm.config.eos_ids)
        end = next((i for i, t in enumerate(tokens) if t in eos), None)
        if end is not None:  # the reference's padding after the end token
            tokens = tokens[: end + 1] + [self.lm.config.pad_id] * (len(tokens) - end - 1)
        event.positions = list(range(index * r.canvas_length, (index + 1) * r.canvas_length))
        event.token_ids, event.first_confidence = tokens, [None] * len(tokens)
        r.generated += tokens
        r.steps_per_canvas.append(r.step)
        r.finished = end is not None or len(r.steps_per_canvas) >= r.canvases_wanted
        r.ended_by_eos = end is not None
        if r.finished:
            event.finished, event.result = True, self._result(r)
            del self.running[r.id]
        else:
            with self.forward_timer:
                self.lm.model.encode(r.argmax[None], r.cache)
            r.encoder_forwards += 1
            r.new_canvas(self.lm.device)
        r.answer_length = event.prefix_length = _answer_length(r.generated, eos)
        return event

    @contextmanager
    def _forward_time(self):
        """A forward run from inside denoise_step: forward time, not the rule's."""
        with self.policy_timer.paused(), self.forward_timer:
            yield

    def _result(self, r: CanvasRequest) -> GenerationResult:
        ids = r.generated[: r.settings.gen_length]
        answer = _answer_length(ids, set(self.lm.config.eos_ids))
        ends, steps = [], 0
        for n in r.steps_per_canvas:
            steps += n
            ends += [steps - 1] * r.canvas_length
        trace = Trace(
            commit_step=ends[: len(ids)],
            commit_step_in_block=[-1] * len(ids),
            first_confidence=[None] * len(ids),
        )
        return GenerationResult(
            text=self.lm.decode(ids[:answer]),
            token_ids=ids,
            answer_length=answer,
            nfe=r.nfe,
            steps_per_block=list(r.steps_per_canvas),
            elapsed_s=time.perf_counter() - r.admitted_at,
            policy_s=0.0,
            early_stopped=r.ended_by_eos,
            method=r.settings.method,
            prompt_length=len(r.prompt),
            trace=trace,
            prefill_positions=len(r.prompt),
        )


def _draft(r: CanvasRequest, index: int) -> dict:
    """The step's draft (the official streamer's put_draft: the argmax canvas), the canvas offsets the
    step accepted (the others were renoised) and the tokens they kept, in that order: the rule's, which
    need not be the argmax (a sample under the entropy bounds; diffusiongemma-cai's forced positions take
    the argmax)."""
    if r.accepted is None:
        return {"canvas": index, "step": r.step, "tokens": r.argmax.tolist(), "accepted": [], "kept": []}
    accepted = r.accepted.nonzero().flatten()
    return {
        "canvas": index,
        "step": r.step,
        "tokens": r.argmax.tolist(),
        "accepted": accepted.tolist(),
        "kept": r.canvas[accepted].tolist(),
    }


def _answer_length(ids: list[int], eos: set) -> int:
    return next((i for i, t in enumerate(ids) if t in eos), len(ids))
