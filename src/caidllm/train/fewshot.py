"""Few-shot training rows: solved examples of the same task before the question.

lm-eval and `caidllm bench --fewshot K` show shots in one of three ways, and a model
trained only zero-shot answers either with one token (issue 47: `tiny-bd` scored 0% on
boolean with 3 shots). A share of the rows is therefore given 1 to `max_shots` shots
of its task (train split, never the row's own question), in one of three styles:

* "turns": each shot an earlier user turn and assistant turn of the chat (lm-eval's
  ``--apply_chat_template --fewshot_as_multiturn``);
* "qa": one user message, "Q: ...\\nA: ..." per shot, a blank line between, then
  "Q: <question>\\nA:" (the bench's layout);
* "plain": one user message, "<shot question>\\n<shot answer>" per shot, a blank line
  between, then the question as it is (lm-eval's single-message prefix with the
  caidllm_* task configs: their fewshot_config's target delimiter "\\n", fewshot
  delimiter "\\n\\n").

Each shot's answer is its worked answer or only its final line ("So the answer is
X.", as the bench shows them), half and half; the row's own answer is always the full
worked answer. Shots that would push the prompt past `max_prompt_tokens` are dropped,
first ones first. The draws use their own seed, so with share 0 every batch is the
one it was before this option existed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from caidllm.tasks import Example, Task
from caidllm.tasks.base import final_line

STYLES = ("turns", "qa", "plain")
Messages = list[dict[str, str]]


def qa_prompt(shots: list[tuple[str, str]], question: str) -> str:
    """The bench's few-shot layout (bench/tasks/bbh.py build_prompt), any shot answers."""
    parts = [f"Q: {q}\nA: {a}" for q, a in shots]
    parts.append(f"Q: {question}\nA:")
    return "\n\n".join(parts)


def plain_prompt(shots: list[tuple[str, str]], question: str) -> str:
    """lm-eval's few-shot prefix in one message (evaluation/tasks/_caidllm_template.yaml)."""
    return "".join(f"{q}\n{a}\n\n" for q, a in shots) + question


def messages(shots: list[tuple[str, str]], question: str, style: str) -> Messages:
    if style == "qa":
        return [{"role": "user", "content": qa_prompt(shots, question)}]
    if style == "plain":
        return [{"role": "user", "content": plain_prompt(shots, question)}]
    turns: Messages = []
    for q, a in shots:
        turns += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return turns + [{"role": "user", "content": question}]


@dataclass(frozen=True)
class FewShot:
    share: float = 0.0  # rows with shots
    max_shots: int = 3
    max_prompt_tokens: int = 768  # a row's prompt stays within this (the canvas comes after it)

    def rng(self, seed: int, step: int) -> random.Random:
        return random.Random(f"{seed}:{step}:fewshot")

    def prompt(
        self, task: Task, example: Example, rng: random.Random, length: Callable[[Messages], int]
    ) -> str | Messages:
        """The row's prompt: its question alone, or messages with shots before it."""
        if self.share <= 0 or rng.random() >= self.share:
            return example.prompt
        k = rng.randint(1, self.max_shots)
        pool = task.examples("train", k + 1, seed=rng.randrange(1 << 62))
        chosen = [e for e in pool if e.prompt != example.prompt][:k]
        shots = [(e.prompt, e.answer if rng.random() < 0.5 else final_line(e.target)) for e in chosen]
        style = rng.choice(STYLES)
        while shots and length(messages(shots, example.prompt, style)) > self.max_prompt_tokens:
            shots = shots[1:]
        return messages(shots, example.prompt, style) if shots else example.prompt
