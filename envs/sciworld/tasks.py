"""ScienceWorld's 30 task types, their train/validation/test variation splits and stable task ids.

A task is one variation of one task type; its id reads ``<task name>/<variation>``, e.g.
``boil/0`` or ``find-animal/225``. ScienceWorld assigns each task type's variations to
splits in three contiguous blocks (train first, then dev, then test); the table below
records those sizes as the engine reports them (``getVariationsTrain/Dev/Test``), so
listing tasks never needs a JVM. ``envs/sciworld/tests/test_sciworld.py`` checks the table
against the engine. ScienceWorld's ``dev`` block is agentgym's ``validation`` split;
``dev`` stays accepted wherever a split is named (:data:`agentgym.contract.core.SPLIT_ALIASES`).

A split's task list is laid out round-robin over the task types (a type drops out once
its variations in the split are used up), so any prefix mixes the types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from agentgym.contract.core import Task, resolve_split
from agentgym.contract.errors import UnknownTask
from agentgym.contract.inputs import decimal

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class TaskType:
    """One ScienceWorld task type: ``num`` is its paper id (``"1-1"``), ``name`` the engine's."""

    num: str
    name: str
    variations: int
    n_train: int
    n_dev: int

    def split_range(self, split: str) -> range:
        """The variation numbers of ``split`` (``dev``: validation's, ScienceWorld's name)."""
        bounds = {
            "train": (0, self.n_train),
            "validation": (self.n_train, self.n_train + self.n_dev),
            "test": (self.n_train + self.n_dev, self.variations),
        }
        return range(*bounds[resolve_split(split, bounds)])


TASK_TYPES: tuple[TaskType, ...] = (
    TaskType("1-1", "boil", 30, 14, 7),
    TaskType("1-2", "melt", 30, 14, 7),
    TaskType("1-3", "freeze", 30, 14, 7),
    TaskType("1-4", "change-the-state-of-matter-of", 30, 14, 7),
    TaskType("2-1", "use-thermometer", 540, 270, 135),
    TaskType("2-2", "measure-melting-point-known-substance", 436, 218, 109),
    TaskType("2-3", "measure-melting-point-unknown-substance", 300, 150, 75),
    TaskType("3-1", "power-component", 20, 10, 5),
    TaskType("3-2", "power-component-renewable-vs-nonrenewable-energy", 20, 10, 5),
    TaskType("3-3", "test-conductivity", 900, 450, 225),
    TaskType("3-4", "test-conductivity-of-unknown-substances", 600, 300, 150),
    TaskType("4-1", "find-living-thing", 300, 150, 75),
    TaskType("4-2", "find-non-living-thing", 300, 150, 75),
    TaskType("4-3", "find-plant", 300, 150, 75),
    TaskType("4-4", "find-animal", 300, 150, 75),
    TaskType("5-1", "grow-plant", 126, 62, 31),
    TaskType("5-2", "grow-fruit", 126, 62, 31),
    TaskType("6-1", "chemistry-mix", 32, 16, 8),
    TaskType("6-2", "chemistry-mix-paint-secondary-color", 36, 18, 9),
    TaskType("6-3", "chemistry-mix-paint-tertiary-color", 36, 18, 9),
    TaskType("7-1", "lifespan-longest-lived", 125, 62, 31),
    TaskType("7-2", "lifespan-shortest-lived", 125, 62, 31),
    TaskType("7-3", "lifespan-longest-lived-then-shortest-lived", 125, 62, 31),
    TaskType("8-1", "identify-life-stages-1", 14, 6, 3),
    TaskType("8-2", "identify-life-stages-2", 10, 4, 2),
    TaskType("9-1", "inclined-plane-determine-angle", 168, 84, 42),
    TaskType("9-2", "inclined-plane-friction-named-surfaces", 1386, 692, 346),
    TaskType("9-3", "inclined-plane-friction-unnamed-surfaces", 162, 80, 40),
    TaskType("10-1", "mendelian-genetics-known-plant", 120, 60, 30),
    TaskType("10-2", "mendelian-genetics-unknown-plant", 480, 240, 120),
)
"""All 30 task types in ScienceWorld's own order (``scienceworld/tasks.json``)."""

BY_KEY: dict[str, TaskType] = {key: t for t in TASK_TYPES for key in (t.num, t.name)}

AGENTGYM_EXCLUDED = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
"""Task types AgentGym's SciWorld server leaves out of its ``data_idx`` numbering."""


def resolve_types(keys: Sequence[str] | None) -> tuple[TaskType, ...]:
    """Task types by name or number (``None``: all 30); ValueError names unknown ones."""
    if keys is None:
        return TASK_TYPES
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown or not keys:
        raise ValueError(
            f"unknown ScienceWorld task type(s) {unknown}; choose from {[t.name for t in TASK_TYPES]}"
        )
    chosen = {BY_KEY[k] for k in keys}
    return tuple(t for t in TASK_TYPES if t in chosen)


def make_task(task_type: TaskType, variation: int, split: str) -> Task:
    meta = {"task_num": task_type.num, "task_name": task_type.name, "variation": variation}
    return Task(task_id=f"{task_type.name}/{variation}", split=split, meta=meta)


def split_of(task_type: TaskType, variation: int) -> str:
    for split in SPLITS:
        if variation in task_type.split_range(split):
            return split
    raise UnknownTask(f"{task_type.name} has variations 0-{task_type.variations - 1}, not {variation}")


@cache
def build_split(split: str, types: tuple[TaskType, ...]) -> tuple[Task, ...]:
    """The task list of ``split`` over ``types``, round-robin (cached: lists are fixed)."""
    ranges = [t.split_range(split) for t in types]
    tasks = []
    for position in range(max(len(r) for r in ranges)):
        for task_type, variations in zip(types, ranges, strict=True):
            if position < len(variations):
                tasks.append(make_task(task_type, variations[position], split))
    return tuple(tasks)


def parse_task_id(task_id: str) -> tuple[TaskType, int]:
    """``"boil/3"`` -> (boil, 3); UnknownTask when the id names no task."""
    name, _, variation = task_id.rpartition("/")
    task_type = BY_KEY.get(name)
    number = decimal(variation)
    if task_type is None or number is None or number >= task_type.variations:
        raise UnknownTask(f"unknown ScienceWorld task id {task_id!r} (expected '<task name>/<variation>')")
    return task_type, number


def agentgym_task_id(data_idx: int) -> str:
    """The task AgentGym's SciWorld server plays for ``data_idx``: its task types (minus
    :data:`AGENTGYM_EXCLUDED`) in order, each with all its variations in order."""
    remaining = data_idx
    for task_type in TASK_TYPES:
        if task_type.num in AGENTGYM_EXCLUDED:
            continue
        if remaining < task_type.variations:
            return f"{task_type.name}/{remaining}"
        remaining -= task_type.variations
    raise UnknownTask(f"data_idx {data_idx} is out of range ({data_idx - remaining} tasks)")
