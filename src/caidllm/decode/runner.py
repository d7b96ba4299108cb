"""Runs a step's forwards: for each group of requests (scheduler.py), one model forward in
its mode over their cache rows, a prediction and a confidence for each position of their
blocks, and their commit policies; the commits go into the Frame's canvas and come back to
the host as one RowStep per request (their bookkeeping is the request's, request.py).

Adding a forward mode: models/modes/ (one module and one registry line). Adding a decoder (a commit rule):
decode/policies/ (one module and one registry line). Neither touches this file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from caidllm.decode import logprobs
from caidllm.decode.block_diffusion import edits
from caidllm.decode.constraints import guide
from caidllm.decode.frame import Frame
from caidllm.decode.policies import StepView, indel
from caidllm.decode.policies.base import distribution_stats, probabilities
from caidllm.decode.request import Request
from caidllm.decode.sampling import predict, token_probability
from caidllm.decode.scheduler import ForwardGroup
from caidllm.decode.timing import DeviceTimer
from caidllm.models import transfer
from caidllm.models.modes import FORWARD_MODES
from caidllm.models.selfspec import verify_logits
from caidllm.models.transfer import to_device


@dataclass
class RowStep:
    """What one step did for one request, on the host: which positions of its block were
    committed, the predicted token and the confidence of every position, and the
    (layer, position) pairs its forward computed."""

    request: Request
    commits: list[bool]
    tokens: list[int]
    confidences: list[float]
    computed_pairs: int
    edits: list[bool] | None = None  # token editing (LLaDA2.1): committed positions rewritten
    fill: dict[int, int] | None = None  # the policy ended the request: generated position -> token (Prophet)
    extra_forwards: int = 0  # forwards beyond the step's one (S2D2's verify forward)


@dataclass
class SelfSpec:
    """What a self-verifying policy (S2D2) reads at a step: its rows' draft logits [R, block, V] (float32,
    the mask token's at -inf), their blocks' tokens [R, block], the temperature, and verify(i, drafted)
    -> [block, V] float32 logits of row i's block (drafted [block] its tokens with the draft filled in)
    read at block size 1 (models/selfspec.py), one forward of that request; and for editing requests, the
    positions token editing rewrites this step (the official LLaDA2 loop verifies the block with them)."""

    logits: torch.Tensor
    block: torch.Tensor
    temperature: float
    verify: Callable[[int, torch.Tensor], torch.Tensor]
    edits: torch.Tensor | None = None  # [R, block] bool: what token editing rewrites this step (LLaDA2.1)


class Runner:
    """Runs the forwards, predictions and policies of a step; times the last two kinds."""

    def __init__(self, lm):
        self.lm = lm
        self.policy_timer = DeviceTimer(lm.device)
        self.forward_timer = DeviceTimer(lm.device)  # time inside the model forwards
        self.forwards = 0  # forward passes run (one per group per step)
        self._finishing = None  # [R] bool: the rows of the group in hand a policy ended (view.finish)
        self.faults: dict[str, Exception] = {}  # request id -> why its policy raised (Engine.take_faults)
        self._verifier = None  # the group in hand's verify forward (a self-verifying policy's)
        self._verified: dict[int, int] = {}  # member index -> verify forwards it ran this step
        self._edits = None  # [R, block] the group in hand's token edits this step (None: no row edits)

    def run(self, frame: Frame, groups: list[ForwardGroup]) -> list[RowStep]:
        rows: list[RowStep] = []
        for group in groups:
            started = time.perf_counter()  # each group ends with its one host transfer: wall time is its cost
            rows.extend(self._advance(frame, group.mode, group.members))
            group.seconds = time.perf_counter() - started
        return rows

    def _advance(self, frame: Frame, name: str, members: list[Request]) -> list[RowStep]:
        lm, device = self.lm, self.lm.device
        block_length = members[0].config.block_length
        slots = [r.slot for r in members]
        starts = [frame.block_start(r.slot, r.layout.span, r.block_bounds[0]) for r in members]
        slot_ids = to_device(slots, device)  # no host sync on the hot path (models/transfer.py)
        columns = to_device(starts, device)[:, None] + torch.arange(block_length, device=device)
        block = frame.canvas[slot_ids[:, None], columns]
        masked = block == lm.config.mask_id
        mode = self._mode(frame, name, members, masked, starts, slot_ids)
        masked = self._commit_only(members, masked)
        with self.forward_timer:
            logits = lm.forward(frame.canvas, frame.attention, frame.cache, mode)
        self.forwards += 1
        mode.after(members)
        self._verifier = self._self_spec_inputs(frame, members, logits, block, starts)
        support, generation = None, None
        if members[0].config.policy_spec.sees_generation:  # the whole generation's logits, then the block's
            offset = members[0].block_bounds[0]
            generation = logits.float().clone()  # a copy: prediction consumes
            generation[..., lm.config.mask_id] = float("-inf")  # the mask token is never predicted
            logits = logits[:, offset : offset + block_length]
        if mode.shadow:  # the block's logits, then its shadow block's: how well the rest supports each token
            logits, shadow = logits.split(block_length, dim=1)
            support = token_probability(shadow, block, lm.config.mask_id)
        new_block, commit, predicted, confidence, edit = self._decide(
            frame, members, logits, block, masked, columns, support, generation
        )
        fills = self._finish(frame, members, generation, slot_ids)
        frame.canvas[slot_ids[:, None], columns] = new_block
        for i, r in enumerate(members):  # a cache mode whose next forward reads them keeps them
            r.cache_mode.after_step(r, confidence[i], commit[i])
        pairs = mode.computed_pairs(lm.config.n_layers, block_length)
        # Commits, tokens and confidences of these rows reach the host in one transfer:
        # the step's one host sync per forward group (transfer.to_host).
        commits, tokens, confidences, edited = transfer.to_host(
            torch.stack(
                [
                    commit.double(),
                    predicted.double(),
                    confidence.double(),
                    (commit if edit is None else edit).double(),
                ]
            )
        )
        return [
            RowStep(
                r,
                [bool(x) for x in commits[i]],
                [int(x) for x in tokens[i]],
                confidences[i],
                pairs,
                None if edit is None else [bool(x) for x in edited[i]],
                fills[i],
                self._verified.get(i, 0),
            )
            for i, r in enumerate(members)
        ]

    def _self_spec_inputs(self, frame: Frame, members: list[Request], logits, block, starts: list[int]):
        """(draft logits, block, verify(member index, drafted)) when a member's policy verifies itself (else
        None): the logits copied before prediction consumes them, the mask token's at -inf."""
        self._verified = {}
        if not any(r.config.policy_spec.self_verifies for r in members):
            return None
        draft = logits.float().clone()
        draft[..., self.lm.config.mask_id] = float("-inf")

        def verify(i: int, drafted: torch.Tensor) -> torch.Tensor:
            slot = members[i].slot
            with self.policy_timer.paused(), self.forward_timer:  # called from inside the policy
                out = verify_logits(self.lm, frame.cache, slot, frame.first_real(slot), starts[i], drafted)
            self.forwards += 1
            self._verified[i] = self._verified.get(i, 0) + 1
            out[..., self.lm.config.mask_id] = float("-inf")  # never predicted, verified or drawn
            return out

        return draft, block, verify

    def _finish(self, frame: Frame, members: list[Request], generation, slot_ids) -> list:
        """Rows whose policy ended them (view.finish): every mask left in the generation takes this step's
        prediction, on the canvas and in the row's fill (generated position -> token); None for the others."""
        finish, self._finishing = self._finishing, None
        if generation is None or finish is None or not finish.any():
            return [None] * len(members)
        span = generation.shape[1]
        columns = frame.width - span + torch.arange(span, device=generation.device)
        canvas = frame.canvas[slot_ids[:, None], columns]
        filled = torch.where(
            (canvas == self.lm.config.mask_id) & finish[:, None], generation.argmax(dim=-1), canvas
        )
        frame.canvas[slot_ids[:, None], columns] = filled
        rows, done = transfer.to_host(filled), finish.tolist()
        return [{p: int(t) for p, t in enumerate(rows[i])} if done[i] else None for i in range(len(members))]

    def _mode(self, frame: Frame, name: str, members: list[Request], masked, starts: list[int], slot_ids):
        """The forward-mode object of this group (models/modes/). Every request was checked at submit
        and the Frame knows each row's first real column: the forward is vouched for (no host sync)."""
        block_length = members[0].config.block_length
        slots = [r.slot for r in members]
        ends = [s + block_length for s in starts]
        if members[0].config.policy_spec.sees_generation:  # the forward returns the whole generation's logits
            starts, ends = [frame.width - r.layout.span for r in members], [frame.width] * len(members)
        common = dict(
            start=starts,
            end=ends,
            rows=frame.row_selector(slots, slot_ids),
            real_from=[frame.first_real(s) for s in slots],
            key_end=self._key_ends(members, masked, starts, frame.canvas.shape[1]),
            causal_span=self._causal_spans(frame, members, masked, starts),
            # a block-causal model's attention blocks are the decoding blocks
            attention_block=block_length if self.lm.config.block_causal else None,
        )
        return FORWARD_MODES[name].for_rows(members, masked, starts, **common)

    @staticmethod
    def _commit_only(members: list[Request], masked):
        """A step that may commit only part of the block (Request.commit_only: the policy's or the cache
        mode's say): the rest waits."""
        only = [r.commit_only() for r in members]
        if all(positions is None for positions in only):
            return masked
        block_length = masked.shape[1]
        allowed = [[positions is None or b in positions for b in range(block_length)] for positions in only]
        return masked & to_device(allowed, masked.device).bool()

    def _decide(
        self, frame: Frame, members: list[Request], logits, block, masked, columns, support, generation=None
    ):
        """Each position's prediction and confidence, the policies' commits (and re-masks), token edits:
        the block's new tokens, what was committed, predicted, the confidences and the edits."""
        mask_id, device = self.lm.config.mask_id, self.lm.device
        specs = [r.config.policy_spec for r in members]
        # A policy that rewrites its block whole (LLaDA2.2's InDel) reads the logits as they come.
        raw = {i: logits[i].float().clone() for i, spec in enumerate(specs) if spec.rewrites}
        # A constrained row's holes lose the tokens that would leave its canvas uncompletable (constraints/).
        saved = guide.mask_logits(members, logits, masked) if any(r.constraint for r in members) else {}
        # Logprobs from these same logits, for the rows that asked (decode/logprobs.py): no extra forward.
        lp_scores = {i: logprobs.scores(logits[i], mask_id) for i, r in enumerate(members) if r.logprobs}
        stats = None
        if any(spec.needs_distribution for spec in specs):
            stats = distribution_stats(logits, mask_id)  # before prediction consumes the logits
        if any(spec.needs_probabilities for spec in specs):
            stats = (stats or (None, None)) + (probabilities(logits, mask_id),)
        predicted, confidence = self._predict(logits, members)
        for i, r in enumerate(members):
            if r.step == 0:
                r.block_first_confidence = confidence[i]
        # Token editing (LLaDA2.1, block-causal models only) rewrites committed positions: it reads only
        # positions that are not masks, whose prediction no policy changes; a self-verifying policy's verify
        # forward reads the edited block.
        answer_starts = [frame.block_start(r.slot, r.layout.span, 0) for r in members]
        edit = edits(members, predicted, confidence, masked, block, columns, answer_starts)
        self._edits = edit
        commit, remask, tokens = self._select(
            members, predicted, confidence, masked, stats, support, generation
        )
        if tokens is not None:  # a policy's own tokens (S2D2's draws at a rejection)
            predicted = tokens
        if saved:  # commits of one step checked against each other
            guide.settle(members, commit, predicted, confidence, saved)
        for i, row_scores in lp_scores.items():
            members[i].logprobs.pending = logprobs.step_values(
                row_scores, predicted[i], members[i].logprobs.top
            )
        new_block = torch.where(commit if edit is None else commit | edit, predicted, block)
        if remask is not None:
            new_block = new_block.masked_fill(remask, mask_id)
        if raw:
            ids = indel.Tokens(mask_id, *self.lm.config.edit_tokens)
            with self.policy_timer:  # the InDel step is its policy's time
                steps = (new_block, commit, predicted)  # rewritten in place for the InDel rows
                indel.rewrite_rows(members, raw, block, *steps, answer_starts, columns, ids)
        if any(spec.revises for spec in specs):
            # A policy that may take tokens back reports its block only once it is final (no mask
            # left): a stream never shows a token that could still change, never a mask.
            revising = to_device([spec.revises for spec in specs], device).bool()[:, None]
            final = ~(new_block == mask_id).any(dim=1, keepdim=True)
            commit = torch.where(revising, final.expand_as(commit), commit)
            predicted = torch.where(revising, new_block, predicted)
        return new_block, commit, predicted, confidence, edit

    @staticmethod
    def _key_ends(members: list[Request], masked, starts: list[int], width: int):
        """[R] the column each row's keys end at this step (None: the canvas's end for every row):
        a policy whose forwards may end early (SlowFast's fast phase) says where in its block."""
        horizons = [r.config.policy_settings.horizon() for r in members]
        if all(h is None for h in horizons):
            return None
        ends = [
            start + h(r.state, masked[i]) if h is not None else torch.full((1,), width, device=masked.device)
            for i, (r, h, start) in enumerate(zip(members, horizons, starts))
        ]
        return torch.cat(ends).clamp(max=width)

    @staticmethod
    def _causal_spans(frame: Frame, members: list[Request], masked, starts: list[int]):
        """[R, 2] each row's token-causal RoPE positions this step (None: no row has any): a policy whose
        forwards are partly autoregressive (S2D2's AR-like caching) says which."""
        rules = [r.config.policy_settings.causal_span() for r in members]
        if all(rule is None for rule in rules):
            return None
        block_positions = to_device(
            [s - frame.first_real(r.slot) for r, s in zip(members, starts)], masked.device
        )
        none = torch.zeros(2, dtype=torch.long, device=masked.device)
        return torch.stack(
            [
                none if rule is None else rule(r, masked[i], block_positions[i])
                for i, (r, rule) in enumerate(zip(members, rules))
            ]
        )

    def _predict(self, logits: torch.Tensor, members: list[Request]):
        """Each position's token and its confidence; sampling runs once per temperature."""
        mask_id = self.lm.config.mask_id
        temperatures = {r.config.temperature for r in members}
        if temperatures == {0}:
            return predict(logits, mask_id, 0.0, None, consume=True)
        predicted = torch.empty(logits.shape[:2], dtype=torch.long, device=logits.device)
        confidence = torch.empty(logits.shape[:2], dtype=torch.float32, device=logits.device)
        for temperature in sorted(temperatures):
            indices = [i for i, r in enumerate(members) if r.config.temperature == temperature]
            generators = [members[i].generator for i in indices] if temperature > 0 else None
            at = to_device(indices, logits.device)
            predicted[at], confidence[at] = predict(
                logits[at], mask_id, temperature, generators, consume=True
            )
        return predicted, confidence

    def _select(
        self, members: list[Request], predicted, confidence, masked, stats=None, support=None, generation=None
    ):
        """Each group of rows with the same policy settings, step and block runs its policy once.
        Returns what to commit and what to send back to the mask (None: nothing anywhere)."""
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(members):
            groups.setdefault((r.policy_key, r.step, r.block), []).append(i)
        first = torch.stack([r.block_first_confidence for r in members])
        commit = torch.zeros_like(masked)
        remask, tokens = None, None
        for indices in groups.values():
            lead = members[indices[0]]
            at = slice(None) if len(indices) == len(members) else to_device(indices, masked.device)
            view = self._view(members, indices, at, predicted, confidence, masked, first, stats)
            if generation is not None:
                view.generation_logits = generation[at]
            if support is not None:
                view.verify_confidence = support[at]
            if self._verifier is not None and lead.config.policy_spec.self_verifies:
                view.self_spec = self._self_spec(lead, indices, at)
            try:
                with self.policy_timer:
                    chosen = lead.policy(view) & view.masked
            except Exception as error:  # noqa: BLE001 - these requests fail alone; the engine drops them
                self.faults.update((members[i].id, error) for i in indices)
                chosen, view.remask = torch.zeros_like(view.masked), None
            if (
                lead.step == lead.step_limit - 1
            ):  # the last step commits whatever is left: no mask leaves the engine
                chosen, view.remask = view.masked, None
            if view.finish is not None:
                self._finishing = torch.zeros(len(members), dtype=torch.bool, device=masked.device)
                self._finishing[at] = view.finish
            if view.remask is not None:
                remask = torch.zeros_like(masked) if remask is None else remask
                remask[at] = view.remask
            for j, i in enumerate(indices):
                for name in lead.state_names:
                    members[i].state[name] = view.state[name][j : j + 1]
            commit[at] = chosen
            if view.tokens is not None:
                tokens = predicted.clone() if tokens is None else tokens
                tokens[at] = view.tokens
        return commit, remask, tokens

    @staticmethod
    def _view(members: list[Request], indices: list[int], at, predicted, confidence, masked, first, stats):
        """The StepView of one select call's rows (indices: theirs among the group's members)."""
        lead = members[indices[0]]
        view = StepView(
            confidence=confidence[at],
            predicted=predicted[at],
            masked=masked[at],
            first_confidence=first[at],
            step=lead.step,
            total_steps=lead.config.steps_per_block,
            block_index=lead.block,
            rows=torch.arange(len(indices), device=masked.device),
            state={name: torch.cat([members[i].state[name] for i in indices]) for name in lead.state_names},
        )
        if stats is not None and stats[0] is not None:
            view.entropy, view.second = stats[0][at], stats[1][at]
        if stats is not None and len(stats) > 2:
            view.probabilities = stats[2][at]
        if lead.policy_state is not None:
            view.policy_states = [members[i].policy_state for i in indices]
        return view

    def _self_spec(self, lead: Request, indices: list[int], at) -> SelfSpec:
        """The SelfSpec of one select call's rows (indices: theirs among the group's members)."""
        draft, block, verify = self._verifier
        return SelfSpec(
            draft[at],
            block[at],
            lead.config.temperature,
            lambda j, drafted: verify(indices[j], drafted),
            None if self._edits is None else self._edits[at],
        )
