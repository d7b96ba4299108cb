"""The step-level engine: every denoising loop of caidllm runs here.

Requests are submitted (queued), admitted into a free slot of the shared
Frame at the next step, and leave as soon as they finish or are cancelled.
One call of `step()` advances the requests of the forward groups the step
policy chooses (step_policies.py: "fair", the default, runs the group owed
the most forward time, so a cheap request is not paced by an expensive
neighbour's forwards; "all" runs every group) by exactly one denoising step
of their own block, and the others not at all: at each of its steps a request runs one forward
(a full forward without a cache, at its block start and every f steps; its
cached mode otherwise), each masked position of its block gets a predicted
token and its confidence, its policy picks which to commit, and the step's
commits are reported as a CommitEvent.

Who shares a forward: the requests whose forward this step has the same mode
("full", "prefix", "dual" or "es" with the same skip schedule) and the same
block length. They may differ in prompt length, block, local step, method,
gen_length and sampling: each row is computed as it would be alone (its own
columns, its own cache row). Requests that cannot share run in separate
forwards (in the same step under "all", in steps of their own as "fair"
chooses), so no request waits for another's block to end. Inside a forward, the commit policy runs once per
group of rows with the same policy settings, step and block (policies are batched tensor functions
of the rows they are given); prediction once per temperature.

A new request's first forward is the refresh of its first block: admitting
it writes only its own slot. Limits: `max_batch` requests in flight (so at
most that many rows per forward) and `max_queue` waiting; past both,
`submit` raises EngineFullError.

The parts: scheduler.py (queue, limits, admission, grouping into forwards),
runner.py (the forwards, prediction and policies of a step), request.py (each
request's bookkeeping and result), timing.py (the step's timers).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator

from caidllm.checks import is_id_list
from caidllm.decode.block_diffusion import Layout, fit_to_model
from caidllm.decode.config import DecodeConfig
from caidllm.decode.constraints import Constraint
from caidllm.decode.constraints.guide import canvas_constraint
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.logprobs import commit_logprobs
from caidllm.decode.policies import make_policy, policy_key
from caidllm.decode.prefix_reuse import PrefixReuse, adopt, make_store
from caidllm.decode.prefix_store import PrefixStore
from caidllm.decode.request import CommitEvent, Request
from caidllm.decode.runner import RowStep, Runner
from caidllm.decode.sampling import request_generator
from caidllm.decode.scheduler import Scheduler
from caidllm.decode.step_policies import DEFAULT_STEP_POLICY
from caidllm.decode.uniform_api import mask_decoder_refusal
from caidllm.errors import InputError
from caidllm.models.families import get_family
from caidllm.models.modes import FORWARD_MODES


def family_refusal(lm, config: DecodeConfig) -> str | None:
    """Why the model's family cannot run `config`'s decoder (None when it can): a forward that needs
    bidirectional attention and unshifted logits (dKV-Cache's columns, WINO's shadow block) on a family
    that predicts position i from i - 1 (Dream) or attends block-causally (LLaDA2, SDAR); names both."""
    c = lm.config
    if get_family(
        c.family
    ).uniform:  # DiffusionGemma has no mask token: its decoders run in uniform_engine.py
        return mask_decoder_refusal(c.family, config.method)
    if get_family(c.family).sequential:  # Nemotron-Labs-Diffusion: decode/nemotron.py, through generate()
        return (
            f"model family {c.family!r} decodes with its own sequential decoders (ar, nemotron-dlm, "
            f"linear-spec) through generate(), not the step engine's {config.method!r}"
        )
    own_refusal = CACHE_MODES[config.cache].refusal(config, lm)  # the cache mode's own rules first
    if own_refusal is not None:
        return own_refusal
    if not (lm.model.extra_left or c.block_causal):
        return None
    own = config.policy_spec.forward
    needs = (
        [f"policy {config.policy!r} needs the {own} forward"]
        if own is not None and FORWARD_MODES[own].unshifted
        else []
    ) + (
        [f"cache mode {config.cache!r} needs the {CACHE_MODES[config.cache].between_refreshes.name} forward"]
        if CACHE_MODES[config.cache].between_refreshes.unshifted
        else []
    )
    if not needs:
        return None
    lacks = "block-causal attention" if c.block_causal else "it predicts position i from i - 1"
    return (
        f"{'; '.join(needs)} (bidirectional attention, unshifted logits), which model family {c.family!r} "
        f"does not have ({lacks})"
    )


def tp_step_policy(lm, step_policy: str | None) -> str:
    """The step policy to run on `lm` (step_policy_for)."""
    return step_policy_for(step_policy, tensor_parallel=getattr(lm, "tp", None) is not None)


def step_policy_for(step_policy: str | None, tensor_parallel: bool) -> str:
    """The step policy to run: a tensor-parallel model's ranks replay rank 0's steps and must choose the
    same groups, which "fair" (each rank's own forward clock) cannot promise: "all" there."""
    if not tensor_parallel:
        return DEFAULT_STEP_POLICY if step_policy is None else step_policy
    if step_policy not in (None, "all"):
        raise InputError(
            f"step policy {step_policy!r} does not apply to a tensor-parallel model: its ranks must "
            "run the same groups at each step, and it chooses by each rank's own forward times; "
            "use 'all'"
        )
    return "all"


class Engine:
    """Holds the requests in flight and advances them together, one denoising step per `step()`.

    Submit and cancel between steps (one thread; BackgroundEngine runs it from a thread of its
    own for servers). `step()` = schedule (scheduler.py), run (runner.py), update (request.py).

    prefix_cache_mb: the prefix store's budget (decode/prefix_reuse.py; None: the default on a
    block-causal model, off on a full-sequence one; 0: off). prefix_store: a store to share (several
    engines, or generate() calls on one model); it wins over prefix_cache_mb. step_policy: which
    forward groups run at a step (step_policies.py: "fair", or "all"; None: fair, all on a
    tensor-parallel model)."""

    def __init__(
        self,
        lm,
        max_batch: int = 8,
        max_queue: int = 256,
        prefix_cache_mb: float | None = None,
        prefix_store: PrefixStore | None = None,
        step_policy: str | None = None,
    ):
        self.lm = lm
        step_policy = tp_step_policy(lm, step_policy)
        store = adopt(prefix_store, lm) if prefix_store is not None else make_store(lm, prefix_cache_mb)
        self.prefix = PrefixReuse(store)
        self.scheduler = Scheduler(lm, max_batch, max_queue, on_admit=self._start, step_policy=step_policy)
        self.runner = Runner(lm)
        self.steps = 0
        self._eos_ids = set(lm.config.eos_ids)
        # A tensor-parallel model's rank 0 (parallel/mirror.py): the other ranks replay this
        # engine's inputs, sent before each step.
        self.mirror = getattr(lm, "mirror", None)
        if self.mirror is not None:
            self.mirror.attach(self)

    # ---- the public surface beside submit / step / run / cancel (the rest: engine.scheduler, .runner) ----

    @property
    def has_work(self) -> bool:
        """Whether a request is queued or in flight."""
        return self.scheduler.has_work

    # What a server reads of any engine (decode/uniform_engine.py answers the same):
    @property
    def forwards(self) -> int:
        """Model forward passes run so far."""
        return self.runner.forwards

    @property
    def prefix_store(self) -> PrefixStore | None:
        return self.prefix.store

    # ---- requests in and out -------------------------------------------------

    def submit(
        self,
        prompt_ids: list[int],
        config: DecodeConfig,
        request_id: str | None = None,
        constraint: Constraint | None = None,
        logprobs: int | None = None,
    ) -> str:
        """Queue a tokenised prompt; it joins the running batch at the next step.
        Everything is checked here, before anything is queued. constraint: structured output
        (decode/constraints/: a regex, a JSON schema, any JSON object, a choice), held in any commit order.
        logprobs: each committed token's logprob and this many top alternatives (decode/logprobs.py; None:
        off)."""
        request = self.prepare(prompt_ids, config, request_id, constraint, logprobs)
        self.scheduler.add(request)
        return request.id

    def prepare(
        self,
        prompt_ids: list[int],
        config: DecodeConfig,
        request_id: str | None = None,
        constraint: Constraint | None = None,
        logprobs: int | None = None,
    ) -> Request:
        """A checked Request, not yet queued (touches no engine state: any thread may call it)."""
        if not isinstance(config, DecodeConfig):
            raise InputError(f"config must be a DecodeConfig (see build_config), got {type(config).__name__}")
        config = copy.deepcopy(config)  # the request's own: a caller's later edit cannot reach it
        if config.fitted_to is None:  # not yet checked and fitted to a model (build_config alone)
            config.validate()
        # a decoder whose forward the family lacks, before the family's defaults apply
        self._check_family(config)
        config = fit_to_model(config, self.lm.config)  # once: a config fitted to this model is returned as is
        prompt = self._check_prompt(prompt_ids, config)
        request_id = uuid.uuid4().hex if request_id is None else str(request_id)
        request = self._new_request(request_id, prompt, config)
        if constraint is not None:
            request.constraint = self._constraint_state(constraint, config)
        if logprobs is not None:
            request.logprobs = commit_logprobs(logprobs, config)
        return request

    def _constraint_state(self, constraint: Constraint, config: DecodeConfig):
        if not isinstance(constraint, Constraint):
            raise InputError(
                f"constraint must be a Constraint (decode/constraints/), got {type(constraint).__name__}"
            )
        if self.mirror is not None:  # the other ranks replay the inputs, not the constraint's choices
            raise InputError(
                f"{constraint.field}: structured output does not run on a tensor-parallel model yet"
            )
        try:
            return canvas_constraint(self.lm, constraint, config)
        except InputError as error:  # about the constraint's field (a server's param: its top-level name)
            error.field = error.field or constraint.field.split(".")[0]
            raise

    def cancel(self, request_id: str) -> None:
        """Remove a queued or in-flight request now (between steps) and free its slot."""
        request = self.scheduler.running.get(request_id)
        self.scheduler.cancel(request_id)
        if request is not None:  # it writes nothing more into the prefix store
            self.prefix.release(request)
        self._mirrored("cancel", request_id)

    def drop_running(self) -> list[str]:
        """Drop every in-flight request and start a fresh Frame; their ids. After a step that raised
        this is required: that step may have advanced some groups and not others. Queued requests stay."""
        self._release_running()
        self._mirrored("drop_running")
        return self.scheduler.drop_running()

    def cancel_all(self) -> list[str]:
        """Drop every queued and in-flight request (shutdown); their ids."""
        self._release_running()
        self._mirrored("cancel_all")
        return self.scheduler.cancel_all()

    def _release_running(self) -> None:
        for request in self.scheduler.running.values():
            self.prefix.release(request)

    def run(self) -> Iterator[CommitEvent]:
        """Step until every submitted request has finished, yielding each event."""
        while self.has_work:
            events = self.step()
            if self.runner.faults:  # a caller stepping alone has nobody else to hand the failure to
                raise next(iter(self.take_faults().values()))
            yield from events

    # ---- one step ----------------------------------------------------------------

    def step(self) -> list[CommitEvent]:
        """Admit waiting requests into free slots, then advance the requests of the groups the
        step policy chose by one denoising step. Returns the step's events."""
        if self.mirror is not None:
            self.mirror.before_step(self)
        groups = self.scheduler.schedule()
        rows = self.runner.run(self.scheduler.frame, groups)
        self.scheduler.ran(groups)
        if self.runner.faults:  # rows whose policy raised leave now (take_faults says why); the others go on
            for row in rows:
                if row.request.id in self.runner.faults:
                    self.prefix.release(row.request)
                    self.scheduler.retire(row.request)
            rows = [row for row in rows if row.request.id not in self.runner.faults]
        events = self._update(rows)
        if self.mirror is not None:
            self.mirror.after_step(self, events)
        return events

    def take_faults(self) -> dict[str, Exception]:
        """The requests whose decode raised since the last call (already out of the engine), and why."""
        faults, self.runner.faults = self.runner.faults, {}
        return faults

    def _update(self, rows: list[RowStep]) -> list[CommitEvent]:
        """Each request records its step; a finished one gets its result and leaves its slot."""
        events = []
        for row in rows:
            request = row.request
            first = request.nfe == 0
            self.prefix.after_forward(self.scheduler.frame, request)
            event = request.record(
                row.commits,
                row.tokens,
                row.confidences,
                row.computed_pairs,
                self._eos_ids,
                self.lm.config.eos_id,
                self.lm.device,
                row.edits,
            )
            request.nfe += row.extra_forwards  # a self-verifying policy's verify forwards
            event.forwards += row.extra_forwards
            if row.fill is not None and not event.finished:
                request.finish_with(row.fill, event, self._eos_ids, self.lm.config.eos_id)
            if first and self.prefix.applies(request):
                event.reused_positions, event.prompt_length = request.reused, len(request.prompt)
            if event.finished:
                event.result = request.result(self.lm, self.runner.policy_timer.total())
            events.append(event)
        for event, row in zip(events, rows):
            if event.finished:
                self.prefix.finish(self.scheduler.frame, row.request)
                self.scheduler.retire(row.request)
        self.steps += bool(events)
        return events

    # ---- helpers -----------------------------------------------------------------

    def _mirrored(self, op: str, *args) -> None:
        if self.mirror is not None:
            self.mirror.record(self, op, *args)

    def _start(self, request: Request, slot: int) -> None:
        """A request took a slot: its policy time so far is the baseline of its own."""
        request.policy_seconds_at_admission = self.runner.policy_timer.total()
        request.start_block(self.lm.device)
        self.prefix.admit(self.scheduler.frame, request)

    def _new_request(self, request_id: str, prompt: list[int], config: DecodeConfig) -> Request:
        lm = self.lm
        # a policy that gates says so in its settings
        own_gating = getattr(config.policy_settings, "gating", None)
        gating = lm.config.confidence_gating if own_gating is None else own_gating
        cache = CACHE_MODES[config.cache]
        refresh_every = cache.refresh_every(
            lm.config.cache_refresh_every if config.refresh_every is None else config.refresh_every
        )
        policy, state_names = make_policy(config, gating)
        generator = request_generator(config.seed, prompt, lm.device) if config.temperature > 0 else None
        request = Request(
            request_id,
            prompt,
            config,
            gating,
            refresh_every,
            policy,
            state_names,
            policy_key(config, gating),
            generator,
            block_causal=lm.config.block_causal,
        )
        # What the policy and the cache mode remember across steps, each in its own object.
        spec = config.policy_spec
        request.policy_state = spec.new_state(config, prompt) if spec.new_state is not None else None
        request.cache_state = cache.new_state(request, lm)
        return request

    def _check_family(self, config: DecodeConfig) -> None:
        CACHE_MODES[config.cache].check_settings(config, self.lm)  # its settings against the model
        refusal = family_refusal(self.lm, config)
        if refusal:
            raise InputError(refusal)

    def _check_prompt(self, prompt_ids, config: DecodeConfig) -> list[int]:
        c = self.lm.config
        if not is_id_list(prompt_ids):
            raise InputError(
                f"a prompt must be a non-empty list of token ids, got {prompt_ids!r:.80}", field="prompt"
            )
        bad = [t for t in prompt_ids if not 0 <= t < c.vocab_size]
        if bad:
            raise InputError(
                f"token id {bad[0]} is outside the vocabulary [0, {c.vocab_size})", field="prompt"
            )
        span = Layout.of(len(prompt_ids), config, c.block_causal).span
        if len(prompt_ids) + span > c.max_length:
            laid = "" if span == config.gen_length else f", laid out to the end of its last block: {span}"
            raise InputError(
                f"prompt ({len(prompt_ids)} tokens) + gen_length ({config.gen_length}{laid}) = "
                f"{len(prompt_ids) + span} exceeds the model's context of {c.max_length} tokens",
                field="prompt",
            )
        return list(prompt_ids)
