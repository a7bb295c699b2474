"""Question-and-answer tasks, as the critique protocol sees them: the problems a critic
judges, and the answer key of the env that serves them.

An env of such tasks (``math``) serves :class:`Problem`\\s and sets ``answer_key`` on its
class; Critique-RL, ``eval --critic`` and :mod:`agentgym.play.critique` read both through this
contract and never import a particular env.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str
    """The gold final answer as written (``"72"``, ``"\\frac{1}{2}"``)."""
    solution: str
    """A worked solution ending with ``The answer is <answer>.``"""
    source: str = "generated"


class AnswerKey(Protocol):
    """How an env's answers are written, read and checked."""

    instruction: str
    """The system prompt an actor answers under (it says how to write the final answer)."""

    def extract(self, reply: str) -> str | None:
        """The final answer written in ``reply`` (None: none)."""
        ...

    def canonical(self, answer: str | None) -> str | None:
        """A key equal for equal answers (``"1,000"`` and ``"1000.0"``), for voting."""
        ...

    def matches(self, predicted: str | None, gold: str) -> bool:
        """Whether an extracted answer equals the gold one."""
        ...

    def is_correct(self, reply: str, gold: str) -> bool:
        """Whether the final answer written in ``reply`` equals ``gold``."""
        ...

    def number(self, answer: str) -> Fraction | None:
        """``answer`` as an exact number, where it is one (to write a plausible wrong one)."""
        ...
