"""WINO: wide-in, narrow-out revokable decoding (Hong et al., "Wide-In, Narrow-Out:
Revokable Decoding for Efficient and Effective DLLMs", arXiv 2507.18578; official code
Feng-Hong/WINO-DLLM, LLaDA/decoding.py `decoding_wino`).

Each step drafts, in one forward, every masked position of the block whose confidence
exceeds `wino_draft` (at most max(min(0.7 * masked, 20), 5) of them, the most confident;
at least the most confident one), and verifies the block's already-drafted tokens: the
forward also runs a shadow copy of the block, all mask tokens at the block's positions,
in which shadow position j sees the whole canvas except position j itself (and the other
shadow positions), so its probability of the drafted token at j says how well the rest
supports it. When a step drafts more than one token, drafted tokens whose verify
probability is below `wino_verify` go back to the mask, at most one fewer than the
previous step drafted (the least supported first). The block ends when no mask is left.

The first decoder that un-commits: the engine reports a block's tokens only once the
block is final (no mask left), so a stream never sees a token that could still change,
and no mask token leaves the engine. LLaDA only (the shadow block needs unshifted
logits: Dream predicts position i from the hidden state of i - 1); no cache (the verify
forward reads the whole canvas). Readings taken: the mask token is never predicted or
counted in the softmax (engine-wide rule; the official code does both); past
`wino_max_steps` steps in a block the rest is committed (the official loop is unbounded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from caidllm.decode.policies.base import PolicySettings, StepView, masked_confidence
from caidllm.errors import InputError
from caidllm.setting_rules import UNIT_INTERVAL, Rule, chosen_by, named, positive_int, unit_interval

STATE = ("wino_last_accept",)


@dataclass
class WinoSettings(PolicySettings):
    """The draft (wide-in) and verify (narrow-out) thresholds, and the most steps a block may take
    (re-masking can undo progress; past it the rest is committed)."""

    draft: float = 0.6
    verify: float = 0.9
    max_steps: int = 256

    OWNER: ClassVar[str] = "wino"
    TITLE: ClassVar[str] = "WINO revokable decoding (arXiv 2507.18578)"
    LEGACY: ClassVar[dict[str, str]] = {
        "wino_draft": "draft",
        "wino_verify": "verify",
        "wino_max_steps": "max_steps",
    }
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("draft", UNIT_INTERVAL, unit_interval),
        Rule("verify", UNIT_INTERVAL, unit_interval),
        Rule("max_steps", "a positive integer", positive_int),
    )

    def check_with(self, config) -> None:
        if self.draft > self.verify:
            (draft, field), (verify, _) = (
                named(config.labels, "wino.draft"),
                named(config.labels, "wino.verify"),
            )
            raise InputError(
                f"WINO thresholds out of order: {draft} ({self.draft}) must not exceed {verify} "
                f"({self.verify}) (draft wide, verify narrow)",
                field=field,
            )
        if config.cache != "none":
            raise InputError(
                f"policy 'wino' with cache={config.cache!r} is not meaningful: WINO's verify forward "
                "reads the whole canvas with a shadow block each step (use cache='none')",
                field=chosen_by(config, "cache"),
            )

    def refuse_unread(self, config) -> None:
        if "steps" in config.given:
            raise InputError(
                f"steps does not apply to method {config.method!r}: a decoder that re-masks takes up "
                "to wino_max_steps steps a block, not steps; give wino_max_steps",
                field="steps",
            )

    def step_limit(self, config) -> int:
        return self.max_steps

    def arguments(self, gating: bool) -> dict:
        return dict(draft=self.draft, verify=self.verify)


FIRST_LAST_ACCEPT = 30  # the official loop's start value of the previous step's draft count


def draft_cap(n_masked: torch.Tensor) -> torch.Tensor:
    return (n_masked * 7 // 10).clamp(min=5).clamp(max=20)


def select(view: StepView, draft: float, verify: float) -> torch.Tensor:
    s, rows = view.state, view.rows
    if view.step == 0:
        s["wino_last_accept"][rows] = FIRST_LAST_ACCEPT
    last_accept = s["wino_last_accept"][rows]
    conf = masked_confidence(view)
    n_masked = view.masked.sum(dim=1)
    # Draft (wide in): above the draft threshold, capped to the most confident; at least the best one.
    wide = conf > draft
    rank = torch.sort(conf, dim=1, descending=True, stable=True).indices.argsort(dim=1)
    capped = rank < draft_cap(n_masked)[:, None]
    best = rank == 0
    over = wide.sum(dim=1) > draft_cap(n_masked)
    commit = torch.where(over[:, None], capped, torch.where(wide.any(dim=1, keepdim=True), wide, best))
    commit &= view.masked
    accepted = commit.sum(dim=1)
    # Verify (narrow out): drafted tokens the rest of the canvas no longer supports.
    support = view.verify_confidence.masked_fill(view.masked, float("inf"))
    weak = support < verify
    limit = last_accept - 1
    ranks_up = torch.sort(support, dim=1, stable=True).indices.argsort(dim=1)
    weak = torch.where((weak.sum(dim=1) >= last_accept)[:, None], ranks_up < limit[:, None], weak)
    view.remask = weak & (accepted > 1)[:, None] & ~view.masked
    s["wino_last_accept"][rows] = accepted
    return commit
