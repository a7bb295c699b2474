"""Math problems: the generated multi-step arithmetic word problems, and loaders for the
GSM8K (``question``, ``answer`` ending ``#### N``) and MATH (``problem``, ``solution``
with ``\\boxed{}``) JSONL formats.

Every problem carries a worked gold solution that ends with "The answer is N." (the env's
expert replies with it), so an answer extractor reads the same answer from it as from
``Problem.answer``.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.contract.problems import Problem
from agentgym.envs.math.answers import last_boxed

# ----- the generator --------------------------------------------------------------------


@dataclass(frozen=True)
class Difficulty:
    min_steps: int
    max_steps: int
    max_number: int
    """Largest number a step introduces (the running total may grow past it)."""
    operations: tuple[str, ...]


DIFFICULTIES: dict[str, Difficulty] = {
    "easy": Difficulty(2, 2, 20, ("buy", "give")),
    "medium": Difficulty(2, 4, 100, ("buy", "give", "boxes", "multiply")),
    "hard": Difficulty(3, 5, 1000, ("buy", "give", "boxes", "multiply", "split")),
}
MIXED = "mixed"
"""Cycle easy, medium, hard problem by problem."""

_PEOPLE = (
    ("Maya", "she", "her"),
    ("Omar", "he", "his"),
    ("Lena", "she", "her"),
    ("Tariq", "he", "his"),
    ("Ines", "she", "her"),
    ("Kenji", "he", "his"),
    ("Priya", "she", "her"),
    ("Jonas", "he", "his"),
)
_ITEMS = ("marbles", "stickers", "apples", "coins", "books", "shells", "cards", "pencils")
_FRIENDS = ("a friend", "a classmate", "a neighbour", "a cousin")


@dataclass(frozen=True)
class _Step:
    sentence: str
    """What happens, e.g. ``she buys 5 more marbles``."""
    working: str
    """The arithmetic, e.g. ``12 + 5 = 17``."""
    value: int


@dataclass(frozen=True)
class _Story:
    rng: random.Random
    pronoun: str
    possessive: str
    items: str
    max_number: int


def _buy(story: _Story, value: int) -> _Step | None:
    n = story.rng.randint(2, story.max_number)
    return _Step(f"{story.pronoun} buys {n} more {story.items}", f"{value} + {n} = {value + n}", value + n)


def _give(story: _Story, value: int) -> _Step | None:
    if value < 3:
        return None  # giving at least 2 keeps the plural right and something left
    n = story.rng.randint(2, min(value - 1, story.max_number))
    friend = story.rng.choice(_FRIENDS)
    return _Step(
        f"{story.pronoun} gives {n} {story.items} to {friend}", f"{value} - {n} = {value - n}", value - n
    )


def _boxes(story: _Story, value: int) -> _Step | None:
    boxes, each = story.rng.randint(2, 5), story.rng.randint(2, max(2, story.max_number // 5))
    total = boxes * each
    return _Step(
        f"{story.pronoun} gets {boxes} boxes with {each} {story.items} in each",
        f"{boxes} × {each} = {total}, and {value} + {total} = {value + total}",
        value + total,
    )


def _multiply(story: _Story, value: int) -> _Step | None:
    factor = story.rng.choice((2, 3))
    if value * factor > 10 * story.max_number:
        return None  # keep totals readable
    verb = "doubles" if factor == 2 else "triples"
    return _Step(
        f"{story.pronoun} {verb} the number of {story.items} {story.pronoun} has",
        f"{value} × {factor} = {value * factor}",
        value * factor,
    )


def _split(story: _Story, value: int) -> _Step | None:
    divisors = [k for k in range(2, 7) if value % k == 0 and value // k > 0]
    if not divisors:
        return None
    k = story.rng.choice(divisors)
    return _Step(
        f"{story.pronoun} splits {story.possessive} {story.items} into {k} equal piles and keeps one pile",
        f"{value} ÷ {k} = {value // k}",
        value // k,
    )


_OPERATIONS: dict[str, Callable[[_Story, int], _Step | None]] = {
    "buy": _buy,
    "give": _give,
    "boxes": _boxes,
    "multiply": _multiply,
    "split": _split,
}


def generate_problem(seed: int, difficulty: str = "medium") -> Problem:
    """One word problem drawn from ``seed``: a starting quantity, then 2-5 steps each
    changing it by one operation of the difficulty; the question asks for the final count."""
    level = DIFFICULTIES[difficulty]
    rng = random.Random(seed)
    name, pronoun, possessive = rng.choice(_PEOPLE)
    story = _Story(rng, pronoun, possessive, rng.choice(_ITEMS), level.max_number)
    value = start = rng.randint(2, level.max_number)
    count = rng.randint(level.min_steps, level.max_steps)
    steps: list[_Step] = []
    while len(steps) < count:
        step = _OPERATIONS[rng.choice(level.operations)](story, value)
        if step is not None:  # an operation that does not fit this total: draw another
            steps.append(step)
            value = step.value
    return _render(name, story, start, steps)


def _render(name: str, story: _Story, start: int, steps: list[_Step]) -> Problem:
    events = [f"{'Then ' if i else ''}{step.sentence}." for i, step in enumerate(steps)]
    events = [event[0].upper() + event[1:] for event in events]
    question = " ".join(
        [f"{name} has {start} {story.items}.", *events, f"How many {story.items} does {name} have now?"]
    )
    working = [f"{name} starts with {start} {story.items}."]
    working += [f"Step {i}: {step.sentence}: {step.working}." for i, step in enumerate(steps, 1)]
    answer = str(steps[-1].value)
    return Problem(question, answer, "\n".join([*working, f"The answer is {answer}."]))


# ----- GSM8K and MATH files ---------------------------------------------------------------

_CALCULATOR = re.compile(r"<<[^>]*>>")


def problem_from_record(record: dict[str, Any], source: str = "file") -> Problem:
    """A GSM8K record (``question``, ``answer`` ending ``#### N``) or a MATH record
    (``problem``, ``solution`` with ``\\boxed{}``; an ``answer`` field wins when present)."""
    if "question" in record and "answer" in record:
        return _gsm8k(record, source)
    if "problem" in record and "solution" in record:
        return _math(record, source)
    raise ValueError(
        f"a math record needs 'question' and 'answer' (GSM8K) or 'problem' and 'solution' (MATH); "
        f"got keys {sorted(record)}"
    )


def _gsm8k(record: dict[str, Any], source: str) -> Problem:
    working, marker, final = str(record["answer"]).rpartition("####")
    if not marker or not final.strip():
        raise ValueError(f"GSM8K answer has no '#### N' line: {str(record['answer'])[-80:]!r}")
    answer = final.strip()
    # GSM8K marks calculator calls as <<48/2=24>>; they are not part of the reasoning text.
    solution = _CALCULATOR.sub("", working).strip()
    return Problem(str(record["question"]), answer, f"{solution}\nThe answer is {answer}.", source)


def _math(record: dict[str, Any], source: str) -> Problem:
    solution = str(record["solution"]).strip()
    answer = record.get("answer") or last_boxed(solution)
    if not answer:
        raise ValueError(f"MATH solution has no \\boxed{{}} answer: {solution[-80:]!r}")
    return Problem(str(record["problem"]), str(answer), f"{solution}\nThe answer is {answer}.", source)


def load_problems(path: str | os.PathLike[str]) -> list[Problem]:
    """Every record of a GSM8K- or MATH-style JSONL file (blank lines skipped)."""
    path = Path(path)
    problems = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                problems.append(problem_from_record(json.loads(line), source=path.name))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
    return problems
