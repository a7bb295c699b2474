"""``choice``: a one-turn task with one correct action among several.

Every task shows the same question with its options in a task-specific order; exactly
one option is right (the same one in every task), so the best policy is learnable from
reward alone and a uniform guess succeeds 1/k of the time. It exists to test that a
trainer really learns (chance -> ~100%) in minutes on a CPU, and as a fast smoke test.
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from agentgym.contract.core import Task, TaskListsMixin, TextEnv, Transition

DEFAULT_OPTIONS = ("red", "green", "blue", "yellow")
SPLIT_SEEDS = {"train": 0, "validation": 500_000, "test": 1_000_000}
"""Each split's option orders come from its own seed range."""
MAX_SPLIT_TASKS = 500_000
"""Tasks a split holds at most, so no split's seeds reach the next split's."""


class ChoiceEnv(TaskListsMixin, TextEnv):
    """Args:
    options: the options shown (in a per-task order).
    answer: the correct option (default: the third, ``blue``).
    n_train / n_validation / n_test: tasks per split (at most :data:`MAX_SPLIT_TASKS`).
    """

    name: ClassVar[str] = "choice"
    description: ClassVar[str] = "One turn: pick the right option among several (a trainer sanity check)."
    action_format: ClassVar[str] = "one of the listed options, as written"
    default_max_turns: ClassVar[int] = 1

    def __init__(
        self,
        *,
        options: tuple[str, ...] | list[str] = DEFAULT_OPTIONS,
        answer: str | None = None,
        n_train: int = 64,
        n_test: int = 32,
        n_validation: int = 32,
        max_turns: int | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns)
        if len(set(options)) < 2:
            raise ValueError("choice needs at least two distinct options")
        self.options = tuple(options)
        self.answer = answer or self.options[min(2, len(self.options) - 1)]
        if self.answer not in self.options:
            raise ValueError(f"answer {self.answer!r} is not among the options {self.options}")
        # Validation after test: the wire's split-after-split numbering (data_idx) stays.
        sizes = (("train", n_train), ("test", n_test), ("validation", n_validation))
        self._tasks = {split: self._build(split, n) for split, n in sizes}
        self._shown: list[str] = []

    def _build(self, split: str, count: int) -> list[Task]:
        if not 0 <= count <= MAX_SPLIT_TASKS:
            raise ValueError(f"a split holds 0 to {MAX_SPLIT_TASKS} tasks, not {count}")
        tasks = []
        for i in range(count):
            seed = SPLIT_SEEDS[split] + i
            order = random.Random(seed).sample(self.options, len(self.options))
            tasks.append(Task(f"choice/{split}/{i}", split, {"seed": seed, "options": order}))
        return tasks

    def instruction(self) -> str:
        return "You will be shown a question with options. Reply with exactly one option, as written."

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        self._shown = list(task.meta["options"])
        listed = ", ".join(self._shown)
        return Transition(
            f"Which colour is the secret colour? Options: {listed}. Answer with one word.", score=0.0
        )

    def _step(self, action: str) -> Transition:
        picked = self.first_option_named(action)
        won = picked == self.answer
        if won:
            verdict = "Correct!"
        elif picked is None:
            verdict = f"Wrong: the reply names none of the options ({', '.join(self._shown)})."
        else:
            verdict = f"Wrong: {picked!r} is not the secret colour."
        return Transition(verdict, score=1.0 if won else 0.0, won=won, lost=not won)

    def first_option_named(self, reply: str) -> str | None:
        """The option the reply names first (whole words, any case): a chatty reply still
        counts as a guess, so an untrained model guesses at least sometimes."""
        found = [
            (m.start(), option)
            for option in self.options
            if (m := re.search(rf"\b{re.escape(option.lower())}\b", reply.lower()))
        ]
        return min(found)[1] if found else None

    def available_actions(self) -> list[str] | None:
        return list(self._shown) if self._shown else None

    def expert_action(self) -> str | None:
        return self.answer
