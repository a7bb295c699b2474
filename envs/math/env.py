"""``MathEnv``: answer a math word problem; reward 1 when the final answer is right.

One turn by default: the reply is read whole (reasoning allowed), its final answer
extracted (``#### N``, ``\\boxed{N}``, "The answer is N", else the last number) and
compared exactly with the gold answer. With ``max_turns > 1`` a wrong reply is told it is
wrong and may try again until the limit (refinement turns).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from agentgym.contract.core import MAX_ACTION_CHARS, Task, TaskListsMixin, TextEnv, Transition
from agentgym.envs.math.answers import (
    answers_match,
    canonical_answer,
    extract_answer,
    is_correct,
    parse_number,
)
from agentgym.envs.math.problems import DIFFICULTIES, MIXED, Problem, generate_problem, load_problems

SPLIT_SEEDS = {"train": 0, "validation": 500_000, "test": 1_000_000}
"""Each split's generated problems come from its own seed range."""
MAX_SPLIT_PROBLEMS = 500_000
"""Generated problems a split holds at most, so no split's seeds reach the next split's."""

INSTRUCTION = """\
Solve the math problem. Reason step by step, then end your reply with the final answer \
on its own line, as: The answer is N"""

DataPaths = str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]]


class MathAnswers:
    """The math env's :class:`~agentgym.contract.problems.AnswerKey`: "The answer is N" (or ``####``,
    ``\\boxed{}``), numbers compared exactly as rationals, symbolic answers as normalized text."""

    instruction = INSTRUCTION
    extract = staticmethod(extract_answer)
    canonical = staticmethod(canonical_answer)
    matches = staticmethod(answers_match)
    is_correct = staticmethod(is_correct)
    number = staticmethod(parse_number)


class MathEnv(TaskListsMixin, TextEnv):
    """Math word problems: generated multi-step arithmetic, or your GSM8K / MATH files.

    Args:
        n_train / n_validation / n_test: generated problems per split (at most
            :data:`MAX_SPLIT_PROBLEMS`).
        difficulty: ``easy`` (2 steps, + and -, numbers to 20), ``medium`` (2-4 steps,
            adds multiplication, to 100), ``hard`` (3-5 steps, adds division, to 1000) or
            ``mixed`` (cycles the three).
        data: JSONL files (GSM8K or MATH records) to use instead of generated problems:
            ``{"train": path, "validation": path, "test": path}`` (any of them), or one path,
            which becomes the ``test`` split.
        max_turns: attempts per problem (default 1).
    """

    name: ClassVar[str] = "math"
    answer_key: ClassVar[MathAnswers] = MathAnswers()
    """How its answers are read and checked (the critique protocol reads it, :mod:`agentgym.contract.problems`)."""
    description: ClassVar[str] = (
        "Math word problems (generated multi-step arithmetic, or GSM8K/MATH files): reward 1 when the "
        "final answer is right."
    )
    action_format: ClassVar[str] = "free-text solution ending with 'The answer is N'"
    default_max_turns: ClassVar[int] = 1

    def __init__(
        self,
        *,
        n_train: int = 500,
        n_test: int = 100,
        n_validation: int = 100,
        difficulty: str = MIXED,
        data: DataPaths | None = None,
        max_turns: int | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns)
        if difficulty != MIXED and difficulty not in DIFFICULTIES:
            raise ValueError(f"unknown difficulty {difficulty!r}; use {', '.join([*DIFFICULTIES, MIXED])}")
        self.difficulty = difficulty
        self._tasks: dict[str, list[Task]] = {}
        self.problems: dict[str, Problem] = {}
        """Every problem by task id."""
        sources = _data_splits(data) if data is not None else None
        # Validation after test: the wire's split-after-split numbering (data_idx) stays.
        for split, count in (("train", n_train), ("test", n_test), ("validation", n_validation)):
            if sources is None:
                self._add_generated(split, count)
            elif split in sources:
                self._add(split, load_problems(sources[split]))
        self._problem: Problem | None = None

    def _add_generated(self, split: str, count: int) -> None:
        if not 0 <= count <= MAX_SPLIT_PROBLEMS:
            raise ValueError(f"a split holds 0 to {MAX_SPLIT_PROBLEMS} generated problems, not {count}")
        levels = list(DIFFICULTIES) if self.difficulty == MIXED else [self.difficulty]
        problems = [generate_problem(SPLIT_SEEDS[split] + i, levels[i % len(levels)]) for i in range(count)]
        self._add(split, problems)

    def _add(self, split: str, problems: list[Problem]) -> None:
        tasks = [Task(f"math/{split}/{i}", split, {"source": p.source}) for i, p in enumerate(problems)]
        self._tasks[split] = tasks
        self.problems.update({task.task_id: p for task, p in zip(tasks, problems, strict=True)})

    def problem(self, task_id: str) -> Problem:
        """The problem of ``task_id`` (question, gold answer, worked solution)."""
        return self.problems[self.task(task_id).task_id]

    # ----- catalogue -------------------------------------------------------------------

    def instruction(self) -> str:
        return INSTRUCTION

    # ----- episode ---------------------------------------------------------------------

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        self._problem = self.problems[task.task_id]
        return Transition(f"Question: {self._problem.question}", score=0.0)

    def _step(self, action: str) -> Transition:
        assert self._problem is not None
        answer = extract_answer(action)
        correct = answers_match(answer, self._problem.answer)
        # The base class counts the turn after this hook; the attempt just made is turn+1.
        last_attempt = self.turn + 1 >= self._episode_max_turns
        extra = {"extracted_answer": answer, "correct": correct}
        if last_attempt or correct:
            extra["gold_answer"] = self._problem.answer
        return Transition(
            _feedback(answer, correct, attempts_left=self._episode_max_turns - self.turn - 1),
            score=1.0 if correct else 0.0,
            won=correct,
            lost=not correct and last_attempt,
            extra=extra,
        )

    def expert_action(self) -> str | None:
        """The gold worked solution on one line, ending with "The answer is N" (just that
        sentence when the solution is longer than an action may be). One line, because the
        ReAct and plain agent formats read an action from a single line."""
        if self._problem is None:
            return None
        solution = " ".join(line.strip() for line in self._problem.solution.splitlines() if line.strip())
        return solution if len(solution) <= MAX_ACTION_CHARS else f"The answer is {self._problem.answer}."


def _feedback(answer: str | None, correct: bool, attempts_left: int) -> str:
    if correct:
        return f"Correct: the answer is {answer}."
    said = "No final answer found (end with 'The answer is N')" if answer is None else f"{answer} is wrong"
    if attempts_left <= 0:
        return f"{said}."
    return f"{said}. Check your solution and try again ({attempts_left} {'attempt' if attempts_left == 1 else 'attempts'} left)."


def _data_splits(data: DataPaths) -> dict[str, str | os.PathLike[str]]:
    if isinstance(data, Mapping):
        unknown = set(data) - set(SPLIT_SEEDS)
        if unknown:
            raise ValueError(f"data splits must be among {sorted(SPLIT_SEEDS)}; got {sorted(unknown)}")
        return dict(data)
    return {"test": data}
