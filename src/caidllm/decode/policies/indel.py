"""LLaDA2.2's InDel decoder ("indel", method "llada2.2"): joint-threshold decoding with Levenshtein edits.

Source: SGLang's ``JointThresholdInDel`` (sgl-project/sglang, python/sglang/srt/dllm/algorithm/
joint_threshold_indel.py, the decoder of PR #31773), re-stated step for step with its defaults (threshold 0.5,
edit_threshold 0, max_post_edit_steps 16); the model supplies two edit tokens (config.json delete_token_id,
split_token_id). At each forward of a block, over its generated positions (a part-prompt block's prompt is
never touched):
- M2T: while original masks remain, every mask above the threshold if at least 1 + (masks the edits made)
  of them pass, else that many most confident masks; once none remain, every mask. A prediction of the
  mask token at an original mask falls back to the best other token.
- T2T: every non-mask position whose prediction differs with probability above edit_threshold.
- The written tokens may be DELETE (the position goes, the block shifts left and a mask pads its end) or
  SPLIT (a mask is inserted before the position's previous token, the block's last token falls off): the
  block keeps its length (the technical report's fixed-length block), its content moves.
- Anti-loop: a block state seen before at this block changes its least confident changing position to its
  best token not yet written there (never the mask at an original mask).
- Termination: post-edit steps (steps starting with no original mask) are counted cumulatively; the step
  reaching max_post_edit_steps, or past block_length + max_post_edit_steps updates, is the final cleanup:
  every mask is resolved and no MASK / DELETE / SPLIT is written. A step that writes nothing ends the block.
Only the current block changes; earlier blocks are final, and a completed block's keys and values are
written by the next block's first forward from its final tokens (the exact block cache stays exact). The
block is reported, committed and streamed only once it ends: a stream never shows text an edit removes.
Deviation (forwards, not tokens): SGLang runs one more forward after a final cleanup that changed tokens,
to write the block's cache; here the next block's fold does it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from caidllm.decode.policies.base import PolicySettings, PolicyState
from caidllm.errors import InputError
from caidllm.setting_rules import BLOCK_CAUSAL, Rule, is_number, non_negative_int

NEG = float("-inf")


def _closed_unit(value) -> bool:
    return is_number(value) and 0 <= value <= 1


@dataclass
class IndelSettings(PolicySettings):
    threshold: float = 0.5
    edit_threshold: float = 0.0
    max_post_edit_steps: int = 16

    OWNER: ClassVar[str] = "indel"
    TITLE: ClassVar[str] = "LLaDA2.2's InDel (SGLang JointThresholdInDel)"
    LEGACY: ClassVar[dict[str, str]] = {"threshold": "threshold"}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("threshold", "a number in [0, 1]", _closed_unit, models=BLOCK_CAUSAL, about="M2T's threshold"),
        Rule(
            "edit_threshold",
            "a number in [0, 1]",
            _closed_unit,
            models=BLOCK_CAUSAL,
            about="T2T's and the edits' threshold",
        ),
        Rule(
            "max_post_edit_steps",
            "an integer >= 0",
            non_negative_int,
            models=BLOCK_CAUSAL,
            about="post-edit steps of a block",
        ),
    )

    def check_with(self, config) -> None:
        if config.temperature:
            raise InputError(
                f"temperature={config.temperature!r}: LLaDA2.2's InDel decodes greedily (SGLang's "
                "JointThresholdInDel takes the argmax); use temperature 0",
                field="temperature",
            )

    def step_limit(self, config) -> int:
        # never reached: the InDel step ends the block by then (one more than SGLang's max_steps)
        return config.block_length + self.max_post_edit_steps + 3


@dataclass
class Tokens:
    """The model's special tokens the step reads."""

    mask: int
    delete: int
    split: int


@dataclass
class BlockState:
    """One block's InDel memory (SGLang's per-request state, reset at each block)."""

    prompt_len: int
    original: list[bool]  # each position's token came from a mask of the block's start (moves with it)
    post_edit_steps: int = 0
    updates: int = 0
    seen: set = field(default_factory=set)  # block states this block started a step with
    written: dict = field(default_factory=dict)  # position -> tokens written there


class IndelState(PolicyState):
    """A request's InDel memory: its block's state, started at the block's first step."""

    def __init__(self, config, prompt):
        self.settings: IndelSettings = config.policy_settings
        self.block: BlockState | None = None

    def start_block(self, request) -> None:
        self.block = None

    def step(self, logits: torch.Tensor, tokens: list[int], prompt_len: int, ids: Tokens):
        """One forward's update of the block `tokens` from its logits [block, V]: (new tokens, ended)."""
        if self.block is None:
            original = [i >= prompt_len and t == ids.mask for i, t in enumerate(tokens)]
            self.block = BlockState(prompt_len, original)
        return indel_step(self.block, self.settings, logits.float(), tokens, ids)


def new_state(config, prompt) -> IndelState:
    return IndelState(config, prompt)


def select(view) -> torch.Tensor:
    """No commit through the shared path: the block is rewritten whole (rewrite_rows)."""
    return torch.zeros_like(view.masked)


def indel_step(state: BlockState, settings: IndelSettings, logits, tokens: list[int], ids: Tokens):
    """One step of one block (SGLang's step for one request): the block's new tokens and whether it ended.
    logits [block, V] on any device (the block's small tensors follow it)."""
    n, device = len(tokens), logits.device
    current = torch.tensor(tokens, device=device)
    probs = logits.softmax(dim=-1)
    x = logits.argmax(dim=-1)
    p = probs.gather(1, x[:, None])[:, 0]
    answer = torch.arange(n, device=device) >= state.prompt_len
    masks = answer & (current == ids.mask)
    original = torch.tensor(state.original, device=device) & masks
    n_original, n_masks = int(original.sum()), int(masks.sum())
    state.updates += 1
    if n_original == 0:
        state.post_edit_steps += 1
    limit = settings.max_post_edit_steps
    final = (
        (limit > 0 and state.post_edit_steps >= limit)
        or (limit == 0 and n_original == 0)
        or state.updates > n + limit
    )
    if not final:
        _fall_back(logits, probs, x, p, original & (x == ids.mask), (ids.mask,))
    transfer = _mask_transfers(p, masks, n_original, n_masks, final, settings.threshold)
    if limit == 0 and n_original > 0 and not bool((original & ~transfer).any()):
        final, transfer = True, masks.clone()
    edit = answer & ~masks & (p > settings.edit_threshold) & (current != x)
    write = transfer | edit
    if not bool(write.any()):
        return tokens, True
    if final:
        forbidden = write & ((x == ids.mask) | (x == ids.delete) | (x == ids.split))
        _fall_back(logits, None, x, None, forbidden, (ids.mask, ids.delete, ids.split))
    key = tuple(tokens)
    if key in state.seen and not final:
        _escape_loop(state, logits, x, p, write & (x != current), original, ids.mask)
    state.seen.add(key)
    block = list(tokens)
    for pos in write.nonzero()[:, 0].tolist():
        token = int(x[pos])
        state.written.setdefault(pos, set()).add(token)
        block[pos] = token
    if any(t in (ids.delete, ids.split) for t in (block[i] for i in range(state.prompt_len, n))):
        block, state.original = apply_edits(block, tokens, state.original, state.prompt_len, ids)
    return block, final


def _fall_back(logits, probs, x, p, where: torch.Tensor, excluded: tuple[int, ...]) -> None:
    """x (and p, when given) at `where`: the best token other than `excluded`."""
    positions = where.nonzero()[:, 0]
    if not positions.numel():
        return
    alternative = logits[positions].clone()
    alternative[:, list(excluded)] = NEG
    x[positions] = alternative.argmax(dim=-1)
    if p is not None:
        p[positions] = probs[positions, x[positions]]


def _mask_transfers(p, masks, n_original: int, n_masks: int, final: bool, threshold: float) -> torch.Tensor:
    transfer = torch.zeros_like(masks)
    if n_masks == 0:
        return transfer
    if final or n_original == 0:
        return masks.clone()
    confidence = torch.where(masks, p, NEG)
    needed = 1 + (n_masks - n_original)  # at least one original mask among them
    above = (confidence > threshold) & masks
    if int(above.sum()) >= needed:
        return above
    transfer[torch.topk(confidence, k=min(needed, n_masks)).indices] = True
    return transfer


def _escape_loop(state: BlockState, logits, x, p, changing, original, mask: int) -> None:
    """The least confident changing position takes its best token not yet written there."""
    positions = changing.nonzero()[:, 0]
    if not positions.numel():
        return
    pos = int(positions[p[positions].argmin()])
    scores = logits[pos].clone()
    for token in state.written.get(pos, ()):
        scores[token] = NEG
    if bool(original[pos]):
        scores[mask] = NEG
    x[pos] = scores.argmax()


def apply_edits(block: list[int], before: list[int], original: list[bool], prompt_len: int, ids: Tokens):
    """DELETE drops its position; SPLIT becomes (mask, the position's token before this step), the mask
    not original; the prompt stays; the result is cut or padded with (non-original) masks to the block."""
    n = len(block)
    tokens, flags = list(before[:prompt_len]), list(original[:prompt_len])
    for i in range(prompt_len, n):
        if block[i] == ids.delete:
            continue
        if block[i] == ids.split:
            tokens += [ids.mask, before[i]]
            flags += [False, original[i]]
        else:
            tokens.append(block[i])
            flags.append(original[i])
    pad = max(0, n - len(tokens))
    return (tokens + [ids.mask] * pad)[:n], (flags + [False] * pad)[:n]


def rewrite_rows(
    members, raw: dict, block, new_block, commit, predicted, answer_starts, columns, ids: Tokens
):
    """The InDel rows of a step (raw: row -> its block's logits, kept before prediction): each block
    rewritten whole; committed (every answer position, so reported and streamed) only once it ends."""
    rows = list(raw)
    before = block[rows].tolist()
    for j, i in enumerate(rows):
        r = members[i]
        start = answer_starts[i]
        prompt_len = int((columns[i] < start).sum())
        tokens, ended = r.policy_state.step(raw[i], before[j], prompt_len, ids)
        new_block[i] = torch.tensor(tokens, device=new_block.device)
        commit[i] = (columns[i] >= start) & ended
        predicted[i] = new_block[i]
