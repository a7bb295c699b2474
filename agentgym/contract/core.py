"""The environment contract every AgentGym environment implements.

An environment is a text-in, text-out episode runner with Gymnasium semantics:

* ``reset(task_id=..., seed=..., options=...) -> (observation, info)`` starts an episode
  on one task. The first observation states the goal.
* ``step(action) -> (observation, reward, terminated, truncated, info)`` plays one turn.
  ``terminated`` means the task ended (won or lost); ``truncated`` means the turn limit
  (``max_turns``, overridable per episode with ``options={"max_turns": N}``) cut it.
  Stepping a finished episode raises :class:`~agentgym.contract.errors.EpisodeOver`.
* ``info`` always carries ``task_id``, ``turn``, ``score`` (task progress in [0, 1]) and
  ``success`` (bool), plus ``available_actions`` when the engine knows them.

Subclasses implement the engine-specific hooks (``_reset``, ``_step``, task listing);
this base class owns the bookkeeping every environment must get right the same way —
turn counting, truncation, the done state and the ``info`` keys — so the contract holds
for all of them. ``agentgym check-env`` verifies the same contract over HTTP.

One instance runs one episode at a time and is never shared between sessions.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentgym.contract.errors import EpisodeOver, UnknownTask
from agentgym.contract.inputs import MAX_ACTION_CHARS, ActionRules, check_common_options, clean_action

__all__ = [
    "MAX_ACTION_CHARS",
    "SPLIT_ALIASES",
    "WEB_PREFIX",
    "ActionRules",
    "Task",
    "TaskListsMixin",
    "TextEnv",
    "Transition",
    "resolve_split",
]
WEB_PREFIX = "/site"
"""Where servers mount an environment's :meth:`TextEnv.web_router` (its own web pages)."""

SPLIT_ALIASES = {"dev": "validation"}
"""Other names of a split, accepted wherever a split is named: ScienceWorld called its
validation split ``dev`` before agentgym named it ``validation``."""


def resolve_split(split: str, names: Collection[str]) -> str:
    """The name among ``names`` (an env's splits) of ``split``: itself when listed, else the
    listed name it is an alias of or that is an alias of it (``dev`` <-> ``validation``),
    else ``split`` unchanged (callers then report it as unknown)."""
    if split in names:
        return split
    canonical = SPLIT_ALIASES.get(split, split)
    return next((name for name in names if SPLIT_ALIASES.get(name, name) == canonical), split)


@dataclass(frozen=True)
class Task:
    """One task of a split: ``task_id`` is stable across machines and versions."""

    task_id: str
    split: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "split": self.split, **self.meta}


@dataclass
class Transition:
    """What an engine hook reports for one turn (before the base class adds bookkeeping)."""

    observation: str
    score: float
    """Task progress in [0, 1] after this turn."""
    won: bool = False
    lost: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    """Engine-specific info keys, merged into ``info``."""


class TextEnv(abc.ABC):
    """Base class of all text environments. See the module docstring for the contract."""

    name: ClassVar[str]
    version: ClassVar[str] = "0.1.0"
    description: ClassVar[str] = ""
    action_format: ClassVar[str] = "free text"
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    default_max_turns: ClassVar[int] = 30
    action_rules: ClassVar[ActionRules] = ActionRules()
    """What the engine accepts as an action (see :mod:`agentgym.contract.inputs`)."""
    engine_process: ClassVar[bool] = False
    """Servers host this env's engines in worker processes (``agentgym.servers.workers``):
    set it for native or heavy engines, whose crash or hang must not take the server down."""
    mirrored_attributes: ClassVar[tuple[str, ...]] = ()
    """Read-only attributes a server reads on a worker-hosted engine without a call (sent
    with every reply), e.g. sciworld's ``jvm_pid``."""
    catalog_link: Callable[..., Any] | None = None
    """Set by an engine worker process: runs a method of the server's catalog instance
    (see :meth:`on_catalog`)."""

    def __init__(self, *, max_turns: int | None = None) -> None:
        self.max_turns = max_turns or self.default_max_turns
        self._task: Task | None = None
        self._turn = 0
        self._score = 0.0
        self._done = True
        self._episode_max_turns = self.max_turns
        self._last_observation = ""
        self._last_info: dict[str, Any] = {}
        self._task_index: dict[str, Task] | None = None

    # ----- what subclasses implement -------------------------------------------------

    @abc.abstractmethod
    def splits(self) -> dict[str, int]:
        """Number of tasks in each split, e.g. ``{"train": 200, "test": 50}``."""

    @abc.abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """The fixed, ordered task list of ``split`` (raise UnknownTask for a bad split; accept
        the names :func:`resolve_split` maps to a split)."""

    @abc.abstractmethod
    def instruction(self) -> str:
        """What an agent needs to know to act: the task family, the action syntax."""

    @abc.abstractmethod
    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        """Start ``task``; return the first observation (which states the goal)."""

    @abc.abstractmethod
    def _step(self, action: str) -> Transition:
        """Apply one already-validated action to the running episode."""

    def available_actions(self) -> list[str] | None:
        """Actions valid now, where the engine knows them; ``None`` otherwise."""
        return None

    def expert_action(self) -> str | None:
        """The oracle's next action, where the engine can give one; ``None`` otherwise."""
        return None

    def warm_up(self) -> None:
        """Start any slow preparation shared by all instances (e.g. generating game files)
        in the background and return at once. Servers call it on the catalog instance at
        start-up; it must be safe to call more than once."""

    def warm_engines(self, count: int) -> None:
        """Keep ``count`` engines (e.g. JVMs) started ahead of demand in this process: start
        them now, return once they are up, and top them up in the background as sessions
        take them. Servers call it (``--warm``) once in every process that hosts this env's
        engines, before the first request. Default: nothing to start ahead."""

    @classmethod
    def worker_config(cls, config: dict[str, Any], workers: int) -> dict[str, Any]:
        """The constructor settings for each of ``workers`` engine worker processes: an env
        whose settings are process-wide limits (JVMs at most) divides them here."""
        return config

    def close(self) -> None:
        """Free the engine. Idempotent."""

    def web_router(self) -> Any:
        """Optional web pages of the environment (e.g. a website people and browsers use):
        a FastAPI ``APIRouter`` whose routes servers mount under :data:`WEB_PREFIX`, or
        ``None`` (the default) for none. Servers ask the catalog instance once, at start-up."""
        return None

    def on_catalog(self, method: str, *args: Any) -> Any:
        """Run ``method`` of the catalog instance, the one a server answers ``/tasks`` with:
        state every session shares (a game cache and its generation queue) lives there. In
        an engine worker process the server runs it; in-process, this instance does."""
        if self.catalog_link is not None:
            return self.catalog_link(method, *args)
        return getattr(self, method)(*args)

    # ----- the contract, implemented once ------------------------------------------

    def task(self, task_id: str) -> Task:
        """Look a task up by id in any split (task lists are fixed, so the index is built once)."""
        if self._task_index is None:
            self._task_index = {t.task_id: t for split in self.splits() for t in self.tasks(split)}
        try:
            return self._task_index[task_id]
        except KeyError:
            raise UnknownTask(f"unknown task id {task_id!r} for env {self.name!r}") from None

    def task_at(self, split: str, index: int) -> Task:
        tasks = self.tasks(split)
        if not 0 <= index < len(tasks):
            raise UnknownTask(f"split {split!r} has {len(tasks)} tasks; index {index} is out of range")
        return tasks[index]

    def reset(
        self,
        *,
        task_id: str | None = None,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on ``task_id`` (or, without one, a task of ``options["split"]``,
        default ``train``, drawn with ``seed``)."""
        options = self.check_options(options)
        task = self._choose_task(task_id, seed, options)
        self._episode_max_turns = options.get("max_turns") or self.max_turns
        transition = self._reset(task, seed, options)
        self._task, self._turn, self._done = task, 0, False
        self._score = transition.score
        return self._record(transition, truncated=False)[0], self._last_info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one turn. Reward is the gain in task score, so an episode's rewards sum
        to its final score."""
        if self._task is None:
            raise EpisodeOver("no episode has started; reset first")
        if self._done:
            raise EpisodeOver("the episode is over; reset to start a new one")
        action = self.validate_action(action)
        transition = self._step(action)
        self._turn += 1
        reward = transition.score - self._score
        self._score = transition.score
        terminated = transition.won or transition.lost
        truncated = not terminated and self._turn >= self._episode_max_turns
        self._done = terminated or truncated
        observation, info = self._record(transition, truncated)
        return observation, reward, terminated, truncated, info

    @classmethod
    def validate_action(cls, action: object) -> str:
        """The action as the engine gets it, or InvalidAction (400) under ``action_rules``.
        Servers call it before the engine thread; ``step`` calls it again for in-process
        users (it is idempotent and costs microseconds)."""
        return clean_action(action, cls.action_rules)

    def check_options(self, options: object) -> dict[str, Any]:
        """Reset options type-checked (SchemaError, 422) before any engine sees them.
        Envs with options of their own extend it (call ``super().check_options`` first)."""
        return check_common_options(options)

    @property
    def current_task(self) -> Task | None:
        return self._task

    @property
    def turn(self) -> int:
        return self._turn

    @property
    def done(self) -> bool:
        return self._done

    @property
    def last_observation(self) -> str:
        return self._last_observation

    @property
    def last_info(self) -> dict[str, Any]:
        return self._last_info

    def metadata(self) -> dict[str, Any]:
        """The body of ``GET /metadata``."""
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "instruction": self.instruction(),
            "action_format": self.action_format,
            "max_action_chars": self.action_rules.max_chars,
            "splits": self.splits(),
            "max_turns": self.max_turns,
            "reward_range": list(self.reward_range),
        }

    def _choose_task(self, task_id: str | None, seed: int | None, options: dict[str, Any]) -> Task:
        if task_id is not None:
            return self.task(task_id)
        split = resolve_split(options.get("split", "train"), self.splits())
        if split not in self.splits():
            raise UnknownTask(f"unknown split {split!r}; splits are {sorted(self.splits())}")
        if "index" in options:
            return self.task_at(split, int(options["index"]))
        return random.Random(seed).choice(self.tasks(split))

    def _record(self, transition: Transition, truncated: bool) -> tuple[str, dict[str, Any]]:
        assert self._task is not None
        info: dict[str, Any] = {
            **transition.extra,
            "task_id": self._task.task_id,
            "turn": self._turn,
            "score": transition.score,
            "success": transition.won,
            "won": transition.won,
            "lost": transition.lost,
            "truncated": truncated,
            "max_turns": self._episode_max_turns,
        }
        actions = self.available_actions()
        if actions is not None:
            info["available_actions"] = actions
        # The oracle's next move travels in info (harness-side data, never shown to the agent by
        # our rollouts) so plain REST users can replay expert episodes and collect demonstrations.
        expert = None if self._done else self.expert_action()
        if expert is not None:
            info["expert_action"] = expert
        self._last_observation, self._last_info = transition.observation, info
        return transition.observation, info

    def __enter__(self) -> TextEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TaskListsMixin:
    """``splits()`` and ``tasks()`` for environments that build their task lists up front
    into ``self._tasks`` (split -> ordered tasks). Put it before ``TextEnv`` in the bases."""

    _tasks: dict[str, list[Task]]

    def splits(self) -> dict[str, int]:
        return {split: len(tasks) for split, tasks in self._tasks.items()}

    def tasks(self, split: str) -> list[Task]:
        split = resolve_split(split, self._tasks)
        if split not in self._tasks:
            raise UnknownTask(f"unknown split {split!r}; splits are {sorted(self._tasks)}")
        return list(self._tasks[split])
