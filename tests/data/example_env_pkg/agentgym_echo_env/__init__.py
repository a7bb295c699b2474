"""A third-party environment package in miniature: ``echo`` asks the agent to repeat a word.

It lives outside AgentGym and registers itself through the ``agentgym.envs`` entry point
in ``agentgym_echo_env-0.1.0.dist-info/entry_points.txt`` (what ``pip install`` of a
package declaring ``[project.entry-points."agentgym.envs"] echo =
"agentgym_echo_env:EchoEnv"`` writes), so ``agentgym serve echo`` finds it on the path.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentgym.contract.core import Task, TaskListsMixin, TextEnv, Transition

WORDS = ("apple", "river", "stone", "cloud", "ember", "maple")


class EchoEnv(TaskListsMixin, TextEnv):
    name: ClassVar[str] = "echo"
    description: ClassVar[str] = "Repeat the word shown (an example of a third-party env package)."
    action_format: ClassVar[str] = "the word, as shown"
    default_max_turns: ClassVar[int] = 2

    def __init__(self, *, n_test: int = len(WORDS), max_turns: int | None = None) -> None:
        super().__init__(max_turns=max_turns)
        self._tasks = {
            "test": [Task(f"echo/{i}", "test", {"word": WORDS[i % len(WORDS)]}) for i in range(n_test)]
        }
        self._word = ""

    def instruction(self) -> str:
        return "Reply with exactly the word you are shown."

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        self._word = task.meta["word"]
        return Transition(f"Say: {self._word}", score=0.0)

    def _step(self, action: str) -> Transition:
        won = action.strip().lower() == self._word
        return Transition("Correct." if won else "Wrong.", score=1.0 if won else 0.0, won=won, lost=not won)

    def expert_action(self) -> str | None:
        return self._word or None
