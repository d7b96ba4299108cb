"""Training batches for masked diffusion SFT.

Each sequence is the chat-templated prompt, then the worked answer, an
end-of-turn token and EOS padding up to the batch's length (as in LLaDA's
SFT): the model learns to fill the unused tail of a canvas with EOS. The
canvas length varies from batch to batch so that the model sees answers
inside canvases of every size it will be asked to fill (up to 256), while
most of the compute goes to answer tokens rather than padding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from caidllm.tasks import get_task


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] clean sequences
    answer_start: torch.Tensor  # [B] first position of the answer region (the prompt is never masked)


def encode_pair(tokenizer, prompt: str, answer: str, eot_id: int) -> tuple[list[int], list[int]]:
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               tokenize=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    answer_ids = tokenizer.encode(answer, add_special_tokens=False) + [eot_id]
    return list(prompt_ids), answer_ids


class TaskStream:
    """An endless, seeded stream of training batches drawn from the train split."""

    def __init__(self, tokenizer, task_weights: dict[str, float], batch_size: int, canvas_lengths: tuple[int, ...],
                 eot_id: int, eos_id: int, seed: int):
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.tasks = [get_task(name) for name in task_weights]
        self.weights = list(task_weights.values())
        self.canvas_lengths = canvas_lengths
        self.eot_id, self.eos_id, self.seed = eot_id, eos_id, seed

    def batch(self, step: int) -> Batch:
        rng = random.Random(f"{self.seed}:{step}")
        pairs = []
        for i in range(self.batch_size):
            task = rng.choices(self.tasks, weights=self.weights)[0]
            example = task.examples("train", 1, seed=rng.randrange(1 << 62))[0]
            pairs.append(encode_pair(self.tokenizer, example.prompt, example.answer, self.eot_id))
        longest_answer = max(len(a) for _, a in pairs)
        fitting = [g for g in self.canvas_lengths if g >= longest_answer] or [longest_answer]
        # Half the batches use the tightest canvas (cheap), half any that fits,
        # so long EOS tails (a 256-token canvas) are still seen often.
        canvas = fitting[0] if rng.random() < 0.5 else rng.choice(fitting)
        total = max(len(p) for p, _ in pairs) + canvas
        ids = torch.full((len(pairs), total), self.eos_id, dtype=torch.long)
        starts = torch.zeros(len(pairs), dtype=torch.long)
        for r, (prompt, answer) in enumerate(pairs):
            sequence = (prompt + answer)[:total]
            ids[r, :len(sequence)] = torch.tensor(sequence)
            starts[r] = len(prompt)
        return Batch(ids, starts)


def mask_answers(batch: Batch, mask_id: int, generator: torch.Generator, eps: float = 1e-3):
    """LLaDA's forward process on the answer region: each sequence draws t ~ U(eps, 1)
    and masks each answer position with probability t. Returns the noisy ids,
    the mask, and p_mask per position (for the 1/t weighting)."""
    ids = batch.input_ids
    B, L = ids.shape
    t = torch.rand(B, generator=generator)
    p_mask = ((1 - eps) * t + eps)[:, None].expand(B, L)
    in_answer = torch.arange(L)[None, :] >= batch.answer_start[:, None]
    masked = (torch.rand(B, L, generator=generator) < p_mask) & in_answer
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask, in_answer
