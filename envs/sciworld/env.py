"""``SciWorldEnv``: ScienceWorld's 30 science tasks behind the AgentGym ``TextEnv`` contract.

Each instance borrows one JVM from the shared :class:`~agentgym.envs.sciworld.jvm.JvmPool`
at its first reset, keeps it across resets and hands it back on ``close()``. The step
path is lean: ``step`` plus ``getScore``, two py4j round trips (see ``_advance``).
ScienceWorld's own ``ScienceWorldEnv.step`` also rebuilds look, inventory, task
description and the valid-action list on every step (76-240 ms of its time); here the
valid actions are computed only for episodes that ask for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from py4j.protocol import Py4JError

from agentgym.contract.core import Task, TextEnv, Transition, resolve_split
from agentgym.contract.dialects import Dialect, closed_true
from agentgym.contract.errors import SchemaError, UnknownTask
from agentgym.envs.sciworld.gold import GOLD_PATHS
from agentgym.envs.sciworld.jvm import Jvm, JvmFailed, JvmPool, JvmSettings, default_max_live, jvm_pool
from agentgym.envs.sciworld.tasks import (
    SPLITS,
    TaskType,
    agentgym_task_id,
    build_split,
    make_task,
    parse_task_id,
    resolve_types,
    split_of,
)

WARM_START_S = 120.0
"""How long a server's start waits for its warm JVMs (then it serves, and they keep starting)."""

SIMPLIFICATIONS = (
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
)
"""ScienceWorld's simplifications; ``"easy"`` means all of them (minus electrical removal
on the electrical tasks, which the engine handles)."""

INSTRUCTION = """\
You are an agent in ScienceWorld, a simulated world for elementary science experiments. \
The first message states your task; each turn you send one action and the world answers \
with what happened. Finish the task in as few turns as you can.

Actions (OBJ and LOC are names of things and places you can see):
open OBJ / close OBJ; activate OBJ / deactivate OBJ; connect OBJ to OBJ; disconnect OBJ; \
use OBJ [on OBJ]; look around; look at OBJ; look in OBJ; read OBJ; move OBJ to OBJ; \
pick up OBJ; put down OBJ; pour OBJ into OBJ; dunk OBJ into OBJ; mix OBJ; go to LOC; \
teleport to LOC (when enabled); eat OBJ; flush OBJ; focus on OBJ (signals the object the \
task is about: focusing on the wrong one fails the task); wait (10 time steps); \
wait1 (1 time step); task (repeat the task); inventory.

Reply with the action only."""


class SciWorldEnv(TextEnv):
    """ScienceWorld tasks with their train/validation/test variation splits (validation is
    ScienceWorld's dev block; ``dev`` is accepted as its name too).

    Args:
        task_types: names (``"boil"``) or numbers (``"1-1"``) of the task types to offer;
            default all 30.
        simplifications: ScienceWorld simplifications for every episode: ``"easy"``
            or a comma-separated subset of :data:`SIMPLIFICATIONS`; per episode
            ``options={"simplifications": ...}``.
        available_actions: put the engine's valid actions in ``info`` every turn:
            ``False`` (default, the lean step), ``True`` (all) or ``N`` (the first N);
            per episode ``options={"available_actions": ...}``. Costs ~35 ms a turn.
        gold_path: give ``expert_action`` the task's gold path (default): the shipped one
            (:mod:`~agentgym.envs.sciworld.gold`), or searched at load; ``False``: no expert.
        max_turns: turn limit (default 100, ScienceWorld's usual step limit).
        heap_mb, max_jvms, spare_jvms, max_idle_jvms, recycle_after, call_timeout_s,
        start_timeout_s:
            the JVM pool (see :class:`~agentgym.envs.sciworld.jvm.JvmSettings`;
            ``max_jvms=None`` sizes the limit to the machine's free memory).
    """

    name: ClassVar[str] = "sciworld"
    compat_dialect: ClassVar[Dialect] = Dialect(close=closed_true)  # agentenv-sciworld: {"id": N}
    description: ClassVar[str] = (
        "ScienceWorld: 30 elementary-science task types (changes of state, thermometers, "
        "circuits, classification, growing plants, chemistry, life stages, inclined planes, "
        "genetics) in a simulated house, each with many variations split train/validation/test."
    )
    action_format: ClassVar[str] = "one action, e.g. 'go to kitchen', 'focus on thermometer'"
    # Score can fall (a task failed after progress), so a step's reward can be negative.
    reward_range: ClassVar[tuple[float, float]] = (-1.0, 1.0)
    default_max_turns: ClassVar[int] = 100
    engine_process: ClassVar[bool] = True
    mirrored_attributes: ClassVar[tuple[str, ...]] = ("jvm_pid",)

    def __init__(
        self,
        *,
        task_types: Sequence[str] | None = None,
        simplifications: str = "",
        available_actions: bool | int = False,
        gold_path: bool = True,
        max_turns: int | None = None,
        heap_mb: int = JvmSettings.heap_mb,
        max_jvms: int | None = JvmSettings.max_live,
        spare_jvms: int = JvmSettings.spare,
        max_idle_jvms: int = JvmSettings.max_idle,
        recycle_after: int = JvmSettings.recycle_after,
        call_timeout_s: float = JvmSettings.call_timeout_s,
        start_timeout_s: float = JvmSettings.start_timeout_s,
    ) -> None:
        super().__init__(max_turns=max_turns)
        self._types = resolve_types(task_types)
        self.simplifications = _check_simplifications(simplifications)
        self.actions_in_info = _check_actions_option(available_actions)
        self.gold_path = gold_path
        settings = JvmSettings(
            heap_mb=heap_mb,
            max_live=max_jvms,
            spare=spare_jvms,
            max_idle=max_idle_jvms,
            recycle_after=recycle_after,
            call_timeout_s=call_timeout_s,
            start_timeout_s=start_timeout_s,
        )
        self.pool: JvmPool = jvm_pool(settings)
        self._jvm: Jvm | None = None
        self._episode_actions: bool | int = False
        self._task_description = ""
        self._look = ""
        self._gold: list[str] = []
        self._gold_position = 0
        self._raw_score = 0
        self._raw_reward = 0

    # ----- catalogue -------------------------------------------------------------------

    def splits(self) -> dict[str, int]:
        return {split: len(build_split(split, self._types)) for split in SPLITS}

    def tasks(self, split: str) -> list[Task]:
        split = resolve_split(split, SPLITS)  # dev: validation
        if split not in SPLITS:
            raise UnknownTask(f"unknown split {split!r}; splits are {list(SPLITS)}")
        return list(build_split(split, self._types))

    def task(self, task_id: str) -> Task:
        """The task an id spells, in O(1) (the base class would index all 7,207 tasks in
        every session's instance)."""
        task_type, variation = parse_task_id(task_id)
        if task_type not in self._types:
            raise UnknownTask(f"task type {task_type.name!r} is not offered by this server")
        return make_task(task_type, variation, split_of(task_type, variation))

    def instruction(self) -> str:
        return INSTRUCTION

    def warm_engines(self, count: int) -> None:
        """Keep ``count`` JVMs of this process's pool started ahead (servers' ``--warm``;
        in-process users get ``spare_jvms``), the first ones started before this returns."""
        self.pool.keep_warm(count, wait_s=WARM_START_S)

    @classmethod
    def worker_config(cls, config: dict[str, Any], workers: int) -> dict[str, Any]:
        """Each worker process has its own JVM pool: the JVM limits are shared out among them."""
        heap_mb = config.get("heap_mb", JvmSettings.heap_mb)
        max_jvms = config.get("max_jvms") or default_max_live(heap_mb)
        max_idle = config.get("max_idle_jvms", JvmSettings.max_idle)
        return config | {"max_jvms": -(-max_jvms // workers), "max_idle_jvms": -(-max_idle // workers)}

    def compat_task_id(self, data_idx: int) -> str:
        """AgentGym's SciWorld numbering of ``data_idx`` (see ``tasks.agentgym_task_id``)."""
        return agentgym_task_id(data_idx)

    def compat_fields(self, route: str) -> dict[str, Any]:
        """What AgentGym's SciWorld server answers beyond the generic compat fields: its
        0-100 score and reward, and on reset the task description apart from the room
        (its client joins the two itself)."""
        fields: dict[str, Any] = {"score": self._raw_score, "reward": self._raw_reward}
        if route == "reset" and self.current_task is not None:
            meta = self.current_task.meta
            fields |= {
                "task_name": meta["task_name"],
                "var_num": meta["variation"],
                "task_description": self._task_description,
                "observation": self._look,
                "deleted": False,
            }
        return fields

    def check_options(self, options: object) -> dict[str, Any]:
        """The common options plus ``simplifications`` and ``available_actions``, checked
        before a JVM is touched."""
        options = super().check_options(options)
        if "simplifications" in options:
            options["simplifications"] = _check_simplifications(options["simplifications"])
        if "available_actions" in options:
            options["available_actions"] = _check_actions_option(options["available_actions"])
        return options

    # ----- episode ---------------------------------------------------------------------

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        # The variation fixes the world; ``seed`` only picks a task (base class).
        task_type, variation = parse_task_id(task.task_id)
        simplifications = options.get("simplifications", self.simplifications)
        _refuse_electrical_removal(task_type, simplifications)
        self._episode_actions = options.get("available_actions", self.actions_in_info)
        jvm = self._acquire()
        with self._engine_call(jvm):
            jvm.episodes += 1
            self._gold = self._load(jvm, task.task_id, task_type.name, variation, simplifications)
            self._task_description = jvm.engine.getTaskDescription()
            self._gold_position, self._raw_score = 0, 0
            self._look = self._advance(jvm, "look around").observation
        return self._transition(f"{self._task_description}\n\n{self._look}")

    def _load(self, jvm: Jvm, task_id: str, name: str, variation: int, simplifications: str) -> list[str]:
        """Load the task into ``jvm`` and return its gold path: a known path (see
        :mod:`~agentgym.envs.sciworld.gold`) spares the engine its path search."""
        known = GOLD_PATHS.get(task_id, simplifications) if self.gold_path else None
        if not self.gold_path or known is not None:
            jvm.engine.load(name, variation, simplifications, False)
            return known or []
        with GOLD_PATHS.searching(task_id, simplifications) as found:  # another worker's search
            jvm.engine.load(name, variation, simplifications, found is None)
            if found is not None:
                return found
            path = list(jvm.engine.getGoldActionSequence())
            GOLD_PATHS.put(task_id, simplifications, path)
            return path

    def _step(self, action: str) -> Transition:
        jvm = self._acquire()
        with self._engine_call(jvm):
            transition = self._advance(jvm, action)
        if self._gold_position < len(self._gold) and action == self._gold[self._gold_position]:
            self._gold_position += 1
        return transition

    def _advance(self, jvm: Jvm, action: str) -> Transition:
        """One engine step on the lean path: ``step`` and ``getScore``, and ``getCompleted``
        only at a full score. A failed task has a negative score (ScienceWorld's own
        wrapper ends episodes on that too), so the common step is two py4j round trips."""
        observation = jvm.engine.step(action)
        raw = round(100 * jvm.engine.getScore())
        won = raw >= 100 and bool(jvm.engine.getCompleted())
        self._raw_reward, self._raw_score = raw - self._raw_score, raw
        return self._transition(observation, won)

    def _transition(self, observation: str, won: bool = False) -> Transition:
        raw = self._raw_score
        return Transition(
            observation=observation,
            score=min(max(raw, 0), 100) / 100,
            won=won,
            lost=raw < 0,
            extra={"raw_score": raw},
        )

    def available_actions(self) -> list[str] | None:
        """The engine's valid action-object combinations when this episode asked for them
        (capped at N when the option is an int); ``None`` otherwise (the lean step)."""
        if self._jvm is None or self._episode_actions is False:
            return None
        jvm = self._jvm
        with self._engine_call(jvm):
            actions = list(jvm.engine.getValidActionObjectCombinations())
        cap = self._episode_actions
        return actions if cap is True else actions[:cap]

    def expert_action(self) -> str | None:
        """The next action of the engine's gold path. The path is fixed at load time and
        advances only when the agent plays its next action, so after a detour it is
        the way back onto the path, not a replanned one."""
        if self._gold_position < len(self._gold):
            return self._gold[self._gold_position]
        return None

    def abort(self) -> None:
        """Kill the JVM of a call stuck past the server's deadline (the engine worker calls
        this from another thread): the call then fails at once with :class:`JvmFailed`, so
        the worker and its other sessions live on instead of being killed with it."""
        jvm = self._jvm
        if jvm is not None:
            jvm.process.kill()

    @property
    def jvm_pid(self) -> int | None:
        """Process id of the JVM this instance holds (``None`` before the first reset)."""
        return self._jvm.pid if self._jvm else None

    def close(self) -> None:
        jvm, self._jvm = self._jvm, None
        if jvm is not None:
            self.pool.release(jvm)

    # ----- internals -------------------------------------------------------------------

    def _acquire(self) -> Jvm:
        if self._jvm is None:
            self._jvm = self.pool.acquire()
        return self._jvm

    @contextlib.contextmanager
    def _engine_call(self, jvm: Jvm) -> Iterator[None]:
        """Around py4j calls: a py4j error means the JVM died or hung, so it is killed and
        dropped (the pool starts a replacement) and :class:`JvmFailed` is raised."""
        try:
            yield
        except Py4JError as exc:
            self._drop_jvm(jvm)
            raise JvmFailed(f"ScienceWorld JVM (pid {jvm.pid}) failed: {type(exc).__name__}: {exc}") from exc

    def _drop_jvm(self, jvm: Jvm) -> None:
        self._jvm = None
        self._gold, self._gold_position = [], 0
        self.pool.discard(jvm)


def _check_simplifications(value: object) -> str:
    """A valid simplification string (``""``, ``"easy"`` or a comma list) in its canonical
    spelling (sorted, no duplicates: the engine reads a set), or SchemaError. Gold paths are
    kept per spelling, so each new spelling of one set would cost a path search."""
    if isinstance(value, list | tuple):
        value = ",".join(map(str, value))
    if not isinstance(value, str):
        raise SchemaError(f"simplifications must be a string, got {type(value).__name__}")
    parts = [p for p in value.replace(" ", "").split(",") if p]
    unknown = [p for p in parts if p not in (*SIMPLIFICATIONS, "easy")]
    if unknown:
        raise SchemaError(
            f"unknown simplification(s) {unknown}; choose 'easy' or from {list(SIMPLIFICATIONS)}"
        )
    return ",".join(sorted(set(parts)))


def _refuse_electrical_removal(task_type: TaskType, simplifications: str) -> None:
    if "noElectricalAction" in simplifications.split(",") and task_type.num in ("3-1", "3-2", "3-3", "3-4"):
        raise SchemaError(f"{task_type.name} needs electrical actions; drop noElectricalAction")


def _check_actions_option(value: object) -> bool | int:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value > 0:
        return value
    raise SchemaError(f"available_actions must be true, false or a positive cap, got {value!r}")
