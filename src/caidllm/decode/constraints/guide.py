"""The engine's hook where logits become tokens (decode/runner.py): before prediction each constrained row's
holes get -inf on every token that would leave its canvas uncompletable; after the policies chose, the row's
commits are taken one at a time, most confident first, each checked against the state the previous ones left
(two holes each fine alone may clash together: such a token is re-picked, the best one still allowed)."""

from __future__ import annotations

import numpy as np
import torch

from caidllm.decode.constraints.automaton import compile_regex
from caidllm.decode.constraints.canvas import CanvasConstraint
from caidllm.decode.constraints.spec import Constraint
from caidllm.errors import InputError


def canvas_constraint(lm, constraint: Constraint, config) -> CanvasConstraint:
    """A request's constraint state over its gen_length positions; InputError naming the field when the
    constraint cannot be compiled, accepts nothing, or its shortest answer does not fit. Decoders that take
    committed tokens back (WINO, LLaDA2.1's editing) are refused: their revisions are not checked."""
    from caidllm.decode.policies import policy_spec

    spec = policy_spec(config.policy)
    if spec.revises or spec.rewrites or config.editing_threshold is not None:
        what = f"policy {config.policy!r}" if spec.revises or spec.rewrites else "token editing"
        raise InputError(
            f"{constraint.field}: {what} revises committed tokens, which the constraint does not "
            "check; use a decoder that only commits"
        )
    automaton = compile_regex(
        lm.tokenizer,
        constraint.regex(),
        tuple(lm.config.eos_ids),
        lm.config.mask_id,
        constraint.field,
        lm.config.vocab_size,
    )
    return CanvasConstraint(automaton, config.gen_length, constraint.field, constraint.max_tokens)


def mask_logits(members, logits: torch.Tensor, masked: torch.Tensor) -> dict[int, torch.Tensor]:
    """Set the disallowed tokens of each constrained row's holes to -inf, in place; returns each such row's
    masked logits (a copy: prediction consumes `logits`) for re-picking in `settle`."""
    saved = {}
    holes = None
    for i, r in enumerate(members):
        if r.constraint is None:
            continue
        holes = masked.cpu() if holes is None else holes
        start = r.block_bounds[0]
        allowed = np.ones((logits.shape[1], logits.shape[2]), dtype=bool)
        for j in range(logits.shape[1]):
            if holes[i, j] and 0 <= start + j < r.constraint.length:
                allowed[j] = r.constraint.allowed(start + j)
        logits[i].masked_fill_(~torch.from_numpy(allowed).to(logits.device), float("-inf"))
        saved[i] = logits[i].float().clone()
    return saved


def settle(
    members,
    commit: torch.Tensor,
    predicted: torch.Tensor,
    confidence: torch.Tensor,
    saved: dict[int, torch.Tensor],
) -> None:
    """Walk each constrained row's commits, most confident first, re-picking a token the earlier ones
    made impossible; `predicted` and `confidence` are corrected in place, the constraint states advanced."""
    for i, logits in saved.items():
        r = members[i]
        chosen = commit[i].nonzero().flatten().tolist()
        conf = confidence[i].tolist()
        start = r.block_bounds[0]
        for j in sorted(chosen, key=lambda j: -conf[j]):
            p = start + j
            if not 0 <= p < r.constraint.length:
                continue
            token = int(predicted[i, j])
            allowed = r.constraint.allowed(p)
            if not allowed[token]:
                row = logits[j].masked_fill(~torch.from_numpy(allowed).to(logits.device), float("-inf"))
                token = int(row.argmax())
                predicted[i, j] = token
                confidence[i, j] = torch.softmax(row, dim=-1)[token].to(confidence.dtype)
            r.constraint.commit(p, token)
