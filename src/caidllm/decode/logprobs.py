"""Log-probabilities of committed tokens (the OpenAI `logprobs` / `top_logprobs`), taken at the step that
committed each token, from the logits that step's decoder read (after a constraint's mask, the mask token
excluded, before temperature): no extra forward. A diffusion token's probability depends on when it was
committed (what was still masked then), so it is the probability the decoder saw, not a left-to-right one."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from caidllm.checks import is_int
from caidllm.errors import InputError

MAX_TOP = 20  # the OpenAI API's top_logprobs limit


@dataclass
class CommitLogprobs:
    """One request's logprobs so far: position -> (token's logprob, [(token, logprob)] of the `top` best)."""

    top: int = 0
    at: dict[int, tuple[float, list[tuple[int, float]]]] = field(default_factory=dict)
    pending: StepLogprobs | None = None  # the step's values, set by the runner, taken by the request's record

    def take(self, positions: list[int], block_start: int) -> list:
        """Keep the entries of the positions committed this step; returns them in the order of `positions`."""
        step, self.pending, out = self.pending, None, []
        for p in positions:
            j = p - block_start
            entry = (step.chosen[j], list(zip(step.top_ids[j], step.top_values[j])))
            self.at[p] = entry
            out.append(entry)
        return out


@dataclass
class StepLogprobs:
    """One row's step, on the host: every block position's chosen-token logprob and its top alternatives."""

    chosen: list[float]
    top_ids: list[list[int]]
    top_values: list[list[float]]


def scores(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[block, V] log-softmax of one row's logits as its decoder reads them (mask token excluded)."""
    row = logits.float().clone()
    row[..., mask_id] = float("-inf")
    return torch.log_softmax(row, dim=-1)


def step_values(row_scores: torch.Tensor, predicted: torch.Tensor, top: int) -> StepLogprobs:
    """The host values of one row: the predicted tokens' logprobs and the `top` best of each position."""
    chosen = row_scores.gather(-1, predicted[:, None]).squeeze(-1)
    values, ids = row_scores.topk(top, dim=-1) if top else (row_scores[:, :0], predicted[:, None][:, :0])
    return StepLogprobs(chosen.tolist(), ids.tolist(), values.tolist())


def commit_logprobs(top, config) -> CommitLogprobs:
    """A request's logprob record; InputError (naming top_logprobs) for a count out of [0, MAX_TOP], and for a
    decoder that takes committed tokens back (WINO, LLaDA2.1's editing, LLaDA2.2's InDel): its later tokens
    were never committed at one step."""
    from caidllm.decode.policies import policy_spec

    if not is_int(top) or not 0 <= top <= MAX_TOP:
        raise InputError(f"top_logprobs must be an integer in [0, {MAX_TOP}], got {top!r}", "top_logprobs")
    spec = policy_spec(config.policy)
    if spec.revises or spec.rewrites or config.editing_threshold is not None:
        raise InputError(
            "logprobs: this decoder revises committed tokens; a token's logprob is taken at the step "
            "that commits it, so use a decoder that only commits",
            "logprobs",
        )
    return CommitLogprobs(top)
