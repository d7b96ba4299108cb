"""Answer extraction and exact-match scoring, BBH style."""

from __future__ import annotations

import re

from caidllm.tasks.registry import CHOICE_NAMES, check_task, family_of

# A choice answer as the bench's BBH scorer takes it: "B", "(B)" or "(B) Frankenstein".
_CHOICE_ANSWER = re.compile(r"^\(?([A-Z])\)?(?=$|[\s.:,)])")
# Last "the answer is X" on a line (lm-eval's BBH CoT filter takes the same).
_ANSWER = re.compile(r"the answer is[ \t]*([^\n]*)", re.IGNORECASE)


def _clean(text: str) -> str:
    text = text.strip()
    if text.endswith("."):
        text = text[:-1]
    return text.strip()


def extract_answer(text: str) -> str | None:
    """The final answer in a generated text, or None.

    Uses the last "the answer is X" (trailing "." and spaces removed).
    Without one, a text of a single short line counts as a direct answer
    (zero-shot style: "No", "24"); a multi-line worked answer missing its
    answer line yields None rather than a guess from its body.
    """
    if not isinstance(text, str):
        return None
    matches = _ANSWER.findall(text)
    if matches:
        answer = _clean(matches[-1])
        return answer or None
    stripped = text.strip()
    if stripped and "\n" not in stripped and len(stripped) <= 40:
        return _clean(stripped) or None
    return None


def normalise(task: str, answer: str) -> str:
    """Dyck answers are compared without whitespace, a multiple-choice answer by
    its letter (as the bench scores BBH's choice tasks); everything else exactly
    (BBH targets are case-sensitive; integers stay as written). A cot variant is
    scored as its family."""
    if family_of(task) == "dyck_languages":
        return "".join(answer.split())
    if task in CHOICE_NAMES:
        letter = _CHOICE_ANSWER.match(answer.strip())
        return f"({letter.group(1)})" if letter else answer.strip()
    return answer.strip()


def score(task: str, generated_text: str, target: str) -> bool:
    """True when the answer extracted from ``generated_text`` equals ``target``."""
    check_task(task)
    answer = extract_answer(generated_text)
    if answer is None:
        return False
    return normalise(task, answer) == normalise(task, target)
