"""BBH tracking_shuffled_objects (three, five and seven objects), with a long worked answer.

A BBH input: n people (Alice, Bob, ... in a fixed order) each start with one
object of a scenario (books, dance partners, balls, gifts, soccer positions),
then n swaps of two people ("First, ... Then, ... Finally, ..."), then a
question on one person's object and the options in the order the objects
were given out. The target is the option's letter, ``(B)``.

The scenarios' sentences and object pools are the ones BBH's inputs use (their
format, read off the task's wording: quirks kept, such as "a orange ball" and the
balls among the gifts); the draws are ours.

Worked answer: the full state at the start and after every swap, each swap line
naming the two objects that change hands (read off the line above), so every line
is a local edit of the one before; then the asked person's object and its letter:

    Start: Alice Ulysses, Bob Frankenstein, Claire Lolita.
    Swap 1, Claire and Bob trade Lolita and Frankenstein: Alice Ulysses, Bob Lolita, Claire Frankenstein.
    ...
    At the end, Bob has Frankenstein, which is option (B).
    So the answer is (B).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from caidllm.tasks.base import final_line

PEOPLE = ("Alice", "Bob", "Claire", "Dave", "Eve", "Fred", "Gertrude")
LETTERS = "ABCDEFG"
COUNTS = {"three": 3, "five": 5, "seven": 7}


@dataclass(frozen=True)
class Scenario:
    setting: str  # after the list of people, up to the colon
    gives: str  # one person's start, "{p}" and "{x}"
    trading: str  # the sentence before the swaps
    swap: str  # after "A and B"
    question: str  # "{p}" is the person asked about
    pool: tuple[str, ...]


SCENARIOS = (
    Scenario(
        "are friends and avid readers who occasionally trade books. At the start of the semester, "
        "they each buy one new book",
        "{p} gets {x}",
        "As the semester proceeds, they start trading around the new books.",
        "swap books",
        "At the end of the semester, {p} has",
        (
            "Catch-22",
            "Frankenstein",
            "Hound of the Baskervilles",
            "Lolita",
            "Moby Dick",
            "The Fellowship of the Ring",
            "The Great Gatsby",
            "The Odyssey",
            "The Pearl",
            "Ulysses",
        ),
    ),
    Scenario(
        "are dancers at a square dance. At the start of a song, they each have a partner",
        "{p} is dancing with {x}",
        "Throughout the song, the dancers often trade partners.",
        "switch partners",
        "At the end of the dance, {p} is dancing with",
        ("Helga", "Izzi", "Jamie", "Karl", "Lola", "Melissa", "Ophelia", "Patrick", "Rodrigo", "Sam"),
    ),
    Scenario(
        "are playing a game. At the start of the game, they are each holding a ball",
        "{p} has a {x}",
        "As the game progresses, pairs of players trade balls.",
        "swap balls",
        "At the end of the game, {p} has the",
        tuple(f"{c} ball" for c in "black blue brown green orange pink purple red white yellow".split()),
    ),
    Scenario(
        "are holding a white elephant gift exchange. At the start of the event, they are each "
        "holding a present of a different color",
        "{p} has a {x}",
        "As the event progresses, pairs of people swap gifts.",
        "swap their gifts",
        "At the end of the event, {p} has the",
        tuple(f"{c} present" for c in "blue brown green purple red white yellow".split())
        + ("black ball", "orange ball", "pink ball"),
    ),
    Scenario(
        "are on the same team in a soccer match. At the start of the match, they are each assigned "
        "to a position",
        "{p} is playing {x}",
        "As the game progresses, pairs of players occasionally swap positions.",
        "trade positions",
        "At the end of the match, {p} is playing",
        (
            "benchwarmer",
            "center midfielder",
            "cheerleader",
            "fullback",
            "goalkeeper",
            "left midfielder",
            "left winger",
            "right midfielder",
            "right winger",
            "striker",
        ),
    ),
)
WORDS = ("Start", "Swap", "trade", "which", "option", "Options", "end") + PEOPLE


def _listing(parts: list[str]) -> str:
    """'A, B, and C' (BBH's serial comma; two parts never occur)."""
    return ", ".join(parts[:-1]) + ", and " + parts[-1]


def _connector(i: int, n: int) -> str:
    return "First" if i == 0 else "Finally" if i == n - 1 else "Then"


def question(scenario: Scenario, objects: list[str], swaps: list[tuple[int, int]], asked: int) -> str:
    people = list(PEOPLE[: len(objects)])
    starts = _listing([scenario.gives.format(p=p, x=x) for p, x in zip(people, objects)])
    moves = " ".join(
        f"{_connector(i, len(swaps))}, {people[a]} and {people[b]} {scenario.swap}."
        for i, (a, b) in enumerate(swaps)
    )
    options = "\n".join(f"({LETTERS[i]}) {x}" for i, x in enumerate(objects))
    return (
        f"{_listing(people)} {scenario.setting}: {starts}.\n{scenario.trading} {moves} "
        f"{scenario.question.format(p=people[asked])}\nOptions:\n{options}"
    )


def _state(people: list[str], held: list[str]) -> str:
    return ", ".join(f"{p} {x}" for p, x in zip(people, held))


def solve(objects: list[str], swaps: list[tuple[int, int]]) -> tuple[list[str], list[str]]:
    """The worked lines (start and one per swap) and who holds what at the end."""
    people = list(PEOPLE[: len(objects)])
    held = list(objects)
    lines = [f"Start: {_state(people, held)}."]
    for i, (a, b) in enumerate(swaps):
        moved = f"{held[a]} and {held[b]}"
        held[a], held[b] = held[b], held[a]
        lines.append(f"Swap {i + 1}, {people[a]} and {people[b]} trade {moved}: {_state(people, held)}.")
    return lines, held


def make(
    scenario: Scenario, objects: list[str], swaps: list[tuple[int, int]], asked: int
) -> tuple[str, str, str]:
    lines, held = solve(objects, swaps)
    final = held[asked]
    target = f"({LETTERS[objects.index(final)]})"
    lines.append(f"At the end, {PEOPLE[asked]} has {final}, which is option {target}.")
    return question(scenario, objects, swaps, asked), "\n".join(lines + [final_line(target)]), target


def draw(rng: random.Random, n: int) -> tuple[str, str, str]:
    scenario = rng.choice(SCENARIOS)
    objects = rng.sample(scenario.pool, n)
    swaps = [tuple(rng.sample(range(n), 2)) for _ in range(n)]
    return make(scenario, objects, swaps, rng.randrange(n))


def generator(count: str):
    """generate(rng) for the task of `count` ("three", "five", "seven") objects."""
    n = COUNTS[count]

    def generate(rng: random.Random) -> tuple[str, str, str]:
        return draw(rng, n)

    return generate


def task_words() -> tuple[str, ...]:
    """Every word of the scenarios, for the tokenizer (some appear only in rare draws)."""
    words = set(WORDS)
    for s in SCENARIOS:
        text = " ".join([s.setting, s.gives, s.trading, s.swap, s.question, *s.pool])
        words.update(w.strip(".,:{}") for w in text.replace("-", " ").split())
    return tuple(sorted(w for w in words if w.isalpha()))
