"""The expert: BabyAI's bot (``minigrid.utils.baby_ai_bot.BabyAIBot``) as text commands.

The bot suggests one primitive action at a time and replans after every primitive the
agent really took, its own or not, so it follows an episode whatever the agent does:
commands that run several primitives (``go to red ball 1``) are fed to it one primitive
at a time. While it walks up to an object in sight (to reach it, pick it up or open it),
the expert says ``go to <that object>``, as AgentGym's agents would; otherwise the
command that does exactly the bot's primitive: ``turn left``, ``turn right``, ``move
forward``, ``pickup <the object in front>``, ``drop``, ``toggle``.
"""

from __future__ import annotations

from typing import Any

from minigrid.core.world_object import WorldObj
from minigrid.envs.babyai.core.verifier import ObjDesc
from minigrid.utils.baby_ai_bot import BabyAIBot, GoNextToSubgoal

from agentgym.envs.babyai.view import DONE, DROP, FORWARD, LEFT, PICKUP, RIGHT, TOGGLE, View

SEARCHES_PER_MOVE = 400
"""Path searches the bot may run to suggest one move. On some maps its replanning loops
forever (GoToImpUnlock seed 6 under minigrid 3.2.0); a normal move takes a few dozen."""

_COMMANDS = {LEFT: "turn left", RIGHT: "turn right", FORWARD: "move forward", DROP: "drop", TOGGLE: "toggle"}


class BotStuck(RuntimeError):
    """The bot ran out of :data:`SEARCHES_PER_MOVE` while planning one move."""


class _BoundedBot(BabyAIBot):
    """BabyAI's bot with a budget of path searches per move (see :data:`SEARCHES_PER_MOVE`)."""

    def __init__(self, level: Any) -> None:
        self.searches_left = SEARCHES_PER_MOVE
        super().__init__(level)

    def _breadth_first_search(self, *args: Any, **kwargs: Any) -> Any:
        self.searches_left -= 1
        if self.searches_left < 0:
            raise BotStuck(f"the bot ran {SEARCHES_PER_MOVE} path searches for one move")
        return super()._breadth_first_search(*args, **kwargs)


class Expert:
    """The bot following one episode of ``level`` (a minigrid BabyAI level, just reset)."""

    def __init__(self, level: Any) -> None:
        self._bot: _BoundedBot | None = _BoundedBot(level)
        self._suggestion: int | None = None
        self._destination: tuple[int, int] | None = None
        self.observe(None)

    def observe(self, taken: int | None) -> None:
        """Replan after the primitive ``taken`` (None: the episode's start)."""
        if self._bot is None:
            return
        self._bot.searches_left = SEARCHES_PER_MOVE
        try:
            self._suggestion = int(self._bot.replan(taken))
            self._destination = _destination(self._bot)
        except Exception:  # a heuristic's bug or dead end ends its advice, never the episode
            self._bot, self._suggestion, self._destination = None, None, None

    def command(self, view: View) -> str | None:
        """The command for the bot's suggestion in ``view``, if it is one the env accepts now.
        (The bot says ``done`` only facing what a "go to" asks for: ``go to`` it.)"""
        target = view.name_at(self._destination) if self._destination is not None else None
        if self._suggestion in (LEFT, RIGHT, FORWARD) and view.plans.get(f"go to {target}", [DONE]) != [DONE]:
            return f"go to {target}"
        if self._suggestion in (PICKUP, DONE):
            front = view.front_name()
            verb = "pickup" if self._suggestion == PICKUP else "go to"
            command = f"{verb} {front}" if front else None
        else:
            command = _COMMANDS.get(self._suggestion)
        return command if command in view.plans else None


def _destination(bot: BabyAIBot) -> tuple[int, int] | None:
    """The cell the bot is walking up to face, where that is an object's: not while it
    explores or looks for a free cell beside something (``PutNext``)."""
    goal = bot.stack[-1] if bot.stack else None
    if not isinstance(goal, GoNextToSubgoal) or goal.reason not in (None, "Open"):
        return None
    if isinstance(goal.datum, ObjDesc):
        pos = bot._find_obj_pos(goal.datum)[1]
    else:
        pos = goal.datum.cur_pos if isinstance(goal.datum, WorldObj) else goal.datum
    return None if pos is None else (int(pos[0]), int(pos[1]))
