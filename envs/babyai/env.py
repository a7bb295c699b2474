"""``babyai``: BabyAI's grid-world levels (minigrid) as a text environment.

The agent reads its mission and what it sees in words (:mod:`.view`) and answers with one
command, AgentGym's BabyAI command set: ``turn left``, ``turn right``, ``move forward``,
``go to <obj> <n>``, ``pickup <obj> <n>`` (or ``pick up``), ``drop``, ``toggle``, ``go
through <door> <n>``, ``toggle and go through <door> <n>``, ``go to goal`` (and ``check
available actions``). A command runs the primitive actions it stands for; one that is not
available now is answered with the reason and costs a turn, not a move.

Reward and success are the level's own: on completing the mission, minigrid's
``1 - 0.9 * steps / max_steps`` (steps: primitive actions so far), else 0. The level
ends the episode too when a wrong move makes the mission impossible, or after its
``max_steps`` primitive actions.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import gymnasium
import minigrid  # noqa: F401 - registers the BabyAI levels with Gymnasium
from minigrid.envs.babyai.core import roomgrid_level

from agentgym.contract.core import Task, TaskListsMixin, TextEnv, Transition
from agentgym.contract.dialects import Dialect
from agentgym.envs.babyai.dialect import BABYAI_DIALECT
from agentgym.envs.babyai.expert import Expert
from agentgym.envs.babyai.levels import agentgym_task_id, build_split, gym_id, parse_task_id
from agentgym.envs.babyai.view import FORWARD, View, look, passable

# minigrid prints every layout it rejects while sampling a level (routine, not an error);
# silence that module's print alone (redirecting sys.stdout would race between sessions).
roomgrid_level.print = lambda *args, **kwargs: None

INSTRUCTION = (
    "You are in a BabyAI grid world and must accomplish the goal you are given. Each turn you "
    "see the objects in view (numbered among those of the same name, nearest first), what is "
    "straight ahead, what you carry, and the available actions. Reply with exactly one action:\n"
    "- turn left / turn right / move forward\n"
    "- go to <obj> <id>: walk up to an object and face it, e.g. go to red ball 1\n"
    "- pickup <obj> <id>: walk up to an object and pick it up (you carry one at a time)\n"
    "- drop: put what you carry in the empty cell in front of you\n"
    "- toggle: open or close the door (or open the box) in front of you; a locked door "
    "opens only while you carry a key of its colour\n"
    "- go through <door> <id>: walk through an open door\n"
    "- toggle and go through <door> <id>: walk up to a closed or locked door, open it and go through\n"
    "- go to goal: walk onto the goal square"
)


class BabyAIEnv(TaskListsMixin, TextEnv):
    """Args:
    n_train / n_validation / n_test: seeds per offered level in each split.
    """

    name: ClassVar[str] = "babyai"
    description: ClassVar[str] = (
        "BabyAI grid-world levels (minigrid): reach, pick up, open and place objects as the mission says."
    )
    action_format: ClassVar[str] = "one command, e.g. 'go to red ball 1', 'pickup blue key 1', 'turn left'"
    default_max_turns: ClassVar[int] = 256
    """Room for the expert, which explores with primitive moves: it takes up to 227 turns on
    the listed tasks. (AgentGym's evaluation, whose agents use ``go to`` throughout, stops at 20.)"""
    compat_dialect: ClassVar[Dialect] = BABYAI_DIALECT

    def __init__(
        self, *, n_train: int = 20, n_validation: int = 2, n_test: int = 3, max_turns: int | None = None
    ) -> None:
        super().__init__(max_turns=max_turns)
        sizes = {"train": n_train, "test": n_test, "validation": n_validation}
        if any(count < 0 for count in sizes.values()):
            raise ValueError(f"seeds per level must be >= 0, not {sizes}")
        # Validation after test in /metadata: the split-after-split data_idx keeps its numbers.
        self._tasks = {split: build_split(split, sizes[split]) for split in ("train", "test", "validation")}
        self._level: Any = None
        self._level_id = ""
        self._expert: Expert | None = None
        self._view: View | None = None

    def task(self, task_id: str) -> Task:
        """Any ``<level>/<seed>`` of AgentGym's 40 levels, listed in a split or not."""
        return parse_task_id(task_id)

    def compat_task_id(self, data_idx: int) -> str:
        """AgentGym's BabyAI numbering of ``data_idx`` (see ``levels.agentgym_task_id``)."""
        return agentgym_task_id(data_idx)

    def compat_fields(self, route: str) -> dict[str, Any]:
        """AgentGym's BabyAI server also answers ``deleted`` on reset."""
        return {"deleted": False} if route == "reset" else {}

    def instruction(self) -> str:
        return INSTRUCTION

    # ----- episode ---------------------------------------------------------------------

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        level_id = gym_id(task.meta["level"])
        if self._level is None or self._level_id != level_id:
            self.close()
            self._level, self._level_id = gymnasium.make(level_id).unwrapped, level_id
        self._level.reset(seed=task.meta["seed"])  # the task's seed fixes the layout, not ``seed``
        self._expert = Expert(self._level)
        self._view = look(self._level)
        goal = f"Your goal: {self._level.mission}"
        return Transition(f"{goal}\n{self._view.describe()}\n{self._view.actions_line()}", score=0.0)

    def _step(self, action: str) -> Transition:
        assert self._view is not None
        command = normalise(action)
        if command == "pickup" and (front := self._view.front_name()):  # the primitive: what is in front
            command = f"pickup {front}"
        if command == "check available actions":
            return Transition(f"You can take the following actions: {', '.join(self._view.plans)}", score=0.0)
        plan = self._view.plans.get(command)
        if plan is None:
            return Transition(f"{self._view.refusal(command)}\n{self._view.actions_line()}", score=0.0)
        reward, terminated, truncated = self._run(plan)
        self._view = look(self._level)
        lines = [self._view.describe(), self._view.actions_line()]
        won = terminated and reward > 0
        if won:
            lines.append("The task is completed.")
        elif terminated:
            lines.append("The task failed: the mission cannot be completed any more.")
        elif truncated:
            lines.append(f"The task failed: you used all {self._level.max_steps} moves this level allows.")
        return Transition(
            "\n".join(lines), score=reward if won else 0.0, won=won, lost=terminated or truncated
        )

    def _run(self, plan: list[int]) -> tuple[float, bool, bool]:
        """Play ``plan``'s primitive actions until it is done or the level ends the episode."""
        assert self._expert is not None
        reward, terminated, truncated = 0.0, False, False
        for primitive in plan:
            if primitive == FORWARD and not self._can_enter_front():
                break  # the last step through a doorway can find the far side taken
            _, reward, terminated, truncated, _ = self._level.step(primitive)
            self._expert.observe(primitive)
            if terminated or truncated:
                break
        return float(reward), terminated, truncated

    def _can_enter_front(self) -> bool:
        return passable(self._level.grid.get(*self._level.front_pos))

    def available_actions(self) -> list[str] | None:
        return list(self._view.plans) if self._view is not None else None

    def expert_action(self) -> str | None:
        if self._expert is None or self._view is None:
            return None
        return self._expert.command(self._view)

    def close(self) -> None:
        if self._level is not None:
            self._level.close()
        self._level, self._expert, self._view = None, None, None


def normalise(action: str) -> str:
    """A command as the view names them: lower case, single spaces, no trailing full stop,
    ``pick up`` read as ``pickup`` (AgentGym's prompt writes it so, its server not)."""
    command = " ".join(action.lower().split()).rstrip(".")
    return re.sub(r"^pick up\b", "pickup", command)
