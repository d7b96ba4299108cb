"""BBH web_of_lies: a chain of five people, each judging the one before.

BBH inputs always read ``Question: A tells the truth|lies. B says A tells
the truth|lies. ... (5 people) Does E tell the truth?`` with five distinct
names from a fixed pool of 50 and the 32 truth patterns equally likely.

Worked answer: one line per person; each line puts the claim and the
previous person's status side by side, so the new status is a local
same/different decision:

    - Sherrie tells the truth.
    - Vernell says Sherrie tells the truth, Sherrie tells the truth, so Vernell tells the truth.
    - Alexis says Vernell lies, Vernell tells the truth, so Alexis lies.
    ...
    So the answer is No.
"""

from __future__ import annotations

import random

from caidllm.tasks.base import final_line

# The name pool of the BBH task (all 50 names its inputs use).
NAMES = (
    "Alejandro Alexis Amberly Andree Antwan Audrie Bernita Christie Conception "
    "Crista Dallas Delbert Delfina Elanor Fidel Fletcher Gwenn Helene Inga Jamey "
    "Jaymie Jerry Jim Ka Kandi Kristian Leda Lorine Maybelle Michael Michaela "
    "Millicent Millie Osvaldo Phoebe Raymond Rashida Ryan Sal Shalonda Shaunda "
    "Shenna Sherrie Sima Tamika Teressa Vernell Vina Willian Yoland"
).split()
PEOPLE = 5
WORDS = ("Question", "tells", "the", "truth", "lies", "says", "Does", "tell", "so")


def _status(truthful: bool) -> str:
    return "tells the truth" if truthful else "lies"


def make(names: list[str], claims: list[bool]) -> tuple[str, str, str]:
    """claims[0]: whether the first person tells the truth; claims[i>0]:
    whether person i says person i-1 tells the truth."""
    sentences = [f"{names[0]} {_status(claims[0])}."]
    # Lines start with "- " so that every name is the same token as in the
    # question (" Sherrie"); at the start of a line it would be another one.
    lines = ["- " + sentences[0]]
    truthful = claims[0]
    for i in range(1, len(names)):
        said = f"{names[i]} says {names[i - 1]} {_status(claims[i])}"
        sentences.append(said + ".")
        prev = f"{names[i - 1]} {_status(truthful)}"
        truthful = claims[i] == truthful
        lines.append(f"- {said}, {prev}, so {names[i]} {_status(truthful)}.")
    prompt = f"Question: {' '.join(sentences)} Does {names[-1]} tell the truth?"
    target = "Yes" if truthful else "No"
    return prompt, "\n".join(lines + [final_line(target)]), target


def generate(rng: random.Random) -> tuple[str, str, str]:
    names = rng.sample(NAMES, PEOPLE)
    claims = [rng.random() < 0.5 for _ in range(PEOPLE)]
    return make(names, claims)
