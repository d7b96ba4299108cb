"""Training batches for masked diffusion SFT.

Each sequence is the chat-templated prompt, then the worked answer, an
end-of-turn token and EOS padding up to the batch's length (as in LLaDA's
SFT): the model learns to fill the unused tail of a canvas with EOS. A batch
holds one task (similar lengths, so little padding); its canvas length varies
from batch to batch so that the model sees answers inside canvases of every
size it will be asked to fill (up to 256), while most of the compute goes to
answer tokens rather than padding.

Each batch also marks its "results": the right-hand side of every ``=`` in
an answer (``7 + 5 = 12`` -> ``12``; a boolean chain's rewritten line).
Masking only those, with every operand in sight, is how a model learns a
fact table: on a micro model, the addition table reached 96% after 1,000
steps that way against 21% with whole-answer masking (training/README.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from caidllm.tasks import get_training_task
from caidllm.train.fewshot import FewShot

# Sequence lengths are rounded up to a multiple of this, so that the CPU
# kernels see a few dozen shapes rather than hundreds (each new shape costs
# memory in oneDNN's primitive cache and the allocator).
LENGTH_QUANTUM = 16


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] clean sequences
    answer_start: torch.Tensor  # [B] first position of the answer region (the prompt is never masked)
    answer_end: torch.Tensor  # [B] one past the end-of-turn token: the EOS padding starts here
    task: str
    results: torch.Tensor | None = None  # [B, L] bool: the right-hand sides of the answers' equations


# A result runs from the token after an "=" up to the next of these (or a newline).
RESULT_ENDS = frozenset("=,:.")


def result_flags(token_texts: list[str]) -> list[bool]:
    """Which tokens are right-hand sides of an "=" (whitespace aside):
    ["4", " *", " ", "8", " =", " ", "3", "2", ","] -> only "3" and "2"."""
    flags, inside = [], False
    for text in token_texts:
        piece = text.strip()
        if "\n" in text or (piece and piece in RESULT_ENDS):
            inside = False
        flags.append(inside and bool(piece))
        if piece == "=":
            inside = True
    return flags


def encode_prompt(tokenizer, prompt: str | list[dict[str, str]]) -> list[int]:
    """The chat-templated prompt: one user message, or earlier turns (few-shot) then it."""
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    prompt_ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    return list(prompt_ids)


def encode_pair(
    tokenizer, prompt: str | list[dict[str, str]], answer: str, eot_id: int
) -> tuple[list[int], list[int]]:
    answer_ids = tokenizer.encode(answer, add_special_tokens=False) + [eot_id]
    return encode_prompt(tokenizer, prompt), answer_ids


class TaskStream:
    """An endless, seeded stream of training batches drawn from the train split."""

    def __init__(
        self,
        tokenizer,
        task_phases: tuple[tuple[int, dict[str, float]], ...],
        batch_size: int,
        canvas_lengths: tuple[int, ...],
        eot_id: int,
        eos_id: int,
        seed: int,
        tight_canvas_share: float,
        fewshot: FewShot | None = None,
    ):
        self.tokenizer, self.batch_size = tokenizer, batch_size
        names = list(dict.fromkeys(name for _, weights in task_phases for name in weights))
        self.tasks = [get_training_task(name) for name in names]
        # (first step, weight per task in self.tasks' order), latest phase first.
        self.phases = sorted(
            ((start, [weights.get(name, 0.0) for name in names]) for start, weights in task_phases),
            reverse=True,
        )
        self.canvas_lengths = canvas_lengths
        self.eot_id, self.eos_id, self.seed = eot_id, eos_id, seed
        self.tight_canvas_share = tight_canvas_share
        self.fewshot = fewshot or FewShot()
        self._token_texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        if token_id not in self._token_texts:
            self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return self._token_texts[token_id]

    def answer_results(self, answer_ids: list[int]) -> list[bool]:
        """result_flags of an encoded answer; its end-of-turn token is no result."""
        return result_flags([self.token_text(i) for i in answer_ids[:-1]])

    def batch(self, step: int) -> Batch:
        rng = random.Random(f"{self.seed}:{step}")
        weights = next(w for start, w in self.phases if step >= start)
        task = rng.choices(self.tasks, weights=weights)[0]
        examples = task.examples("train", self.batch_size, seed=rng.randrange(1 << 62))
        shots_rng = self.fewshot.rng(self.seed, step)
        prompts = [
            self.fewshot.prompt(task, e, shots_rng, lambda m: len(encode_prompt(self.tokenizer, m)))
            for e in examples
        ]
        pairs = [encode_pair(self.tokenizer, p, e.answer, self.eot_id) for p, e in zip(prompts, examples)]
        longest_answer = max(len(a) for _, a in pairs)
        fitting = [g for g in self.canvas_lengths if g >= longest_answer] or [longest_answer]
        # Mostly the tightest canvas (cheap); otherwise any that fits, so long
        # EOS tails (a 256-token canvas) are still seen.
        canvas = fitting[0] if rng.random() < self.tight_canvas_share else rng.choice(fitting)
        total = max(len(p) for p, _ in pairs) + canvas
        total = -(-total // LENGTH_QUANTUM) * LENGTH_QUANTUM
        ids = torch.full((len(pairs), total), self.eos_id, dtype=torch.long)
        starts = torch.zeros(len(pairs), dtype=torch.long)
        ends = torch.zeros(len(pairs), dtype=torch.long)
        results = torch.zeros(len(pairs), total, dtype=torch.bool)
        for r, (prompt, answer) in enumerate(pairs):
            sequence = (prompt + answer)[:total]
            ids[r, : len(sequence)] = torch.tensor(sequence)
            starts[r], ends[r] = len(prompt), len(sequence)
            flags = self.answer_results(answer)
            results[r, len(prompt) : len(prompt) + len(flags)] = torch.tensor(flags, dtype=torch.bool)
        return Batch(ids, starts, ends, task.name, results)


def mask_answers(
    batch: Batch,
    mask_id: int,
    generator: torch.Generator,
    block_share: float = 0.0,
    block_length: int = 64,
    result_share: float = 0.0,
    cut_share: float = 0.0,
    eps: float = 1e-3,
):
    """Noise the answer region. Each row draws t ~ U(eps, 1).

    Plain rows follow LLaDA's forward process: every answer position is
    masked with probability t. Rows that have results (batch.results) can
    instead be:

    * "result rows" (a share `result_share`): only the results are masked,
      with probability t, every other token in sight. Right for a drill of
      independent facts, where no other token gives a result away;
    * "cut rows" (a share `cut_share` of the rest): the answer is clean up
      to the start of one of its results, drawn at random, and masked from
      there on (probability 1). That is what a decoder going left to right
      sees when it reaches a result; in a chain, later tokens repeat earlier
      results (the next line's operands, the final answer), and a model
      trained with them in sight learns to copy results rather than work
      them out.

    Of the other rows, a share `block_share` are "block rows", the inputs a
    block decoder actually sees: a clean answer prefix of random length,
    then `block_length` positions masked with probability t, then a fully
    masked tail (probability 1).

    Returns the noisy ids, the mask, the masking probability per position
    (for the loss weighting) and the answer region."""
    ids = batch.input_ids
    B, L = ids.shape
    positions = torch.arange(L)[None, :]
    t = torch.rand(B, generator=generator)
    p_mask = ((1 - eps) * t + eps)[:, None].expand(B, L)
    in_answer = positions >= batch.answer_start[:, None]
    results = batch.results if batch.results is not None else torch.zeros(B, L, dtype=torch.bool)
    is_result_row = (torch.rand(B, generator=generator) < result_share) & results.any(dim=1)
    is_cut_row = (torch.rand(B, generator=generator) < cut_share) & results.any(dim=1) & ~is_result_row
    is_block_row = (torch.rand(B, generator=generator) < block_share) & ~is_result_row & ~is_cut_row
    cut = _cut_columns(results, positions, generator)  # the draws in this order: the same noise for a seed
    block_start, block_end = _block_bounds(batch, is_block_row, block_length, L, generator)
    cut_tail = is_cut_row[:, None] & (positions >= cut[:, None])
    p_mask = torch.where((positions >= block_end) | cut_tail, torch.ones_like(p_mask), p_mask)
    noised = positions >= block_start  # the clean prefix of block rows is never masked
    noised = torch.where(is_result_row[:, None], results, noised)
    noised = torch.where(is_cut_row[:, None], cut_tail, noised)
    masked = (torch.rand(B, L, generator=generator) < p_mask) & noised
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask, in_answer


def _cut_columns(results: torch.Tensor, positions: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Cut rows: the k-th result start, k drawn uniformly among the row's results (L for a row without)."""
    B, L = results.shape
    result_starts = results & ~torch.nn.functional.pad(results, (1, 0))[:, :L]
    k = (torch.rand(B, generator=generator) * result_starts.sum(dim=1)).long() + 1
    first = torch.where(result_starts & (result_starts.cumsum(dim=1) == k[:, None]), positions, L)
    return first.min(dim=1).values


def _block_bounds(
    batch: Batch, is_block_row: torch.Tensor, block_length: int, L: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, 1] start and end of the noised block: block rows start anywhere from the answer's first position
    to its end-of-turn token and span block_length; the others span the whole answer."""
    span = (batch.answer_end - batch.answer_start).clamp(min=1)
    block_start = batch.answer_start + (torch.rand(len(is_block_row), generator=generator) * span).long()
    block_start = torch.where(is_block_row, block_start, batch.answer_start)[:, None]
    block_end = torch.where(
        is_block_row[:, None], block_start + block_length, torch.full_like(block_start, L)
    )
    return block_start, block_end


def masked_loss(
    logits: torch.Tensor,
    ids: torch.Tensor,
    masked: torch.Tensor,
    p_mask: torch.Tensor,
    in_answer: torch.Tensor,
) -> torch.Tensor:
    """LLaDA's SFT loss: cross-entropy on the masked positions weighted by 1 / their
    masking probability, normalised by each row's answer length, averaged over rows."""
    token_loss = F.cross_entropy(logits[masked].float(), ids[masked], reduction="none") / p_mask[masked]
    answer_length = in_answer.sum(dim=1, keepdim=True).expand_as(masked)[masked]
    return (token_loss / answer_length).sum() / ids.shape[0]
