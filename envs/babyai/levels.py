"""BabyAI's levels as AgentGym numbers them, their splits by seed, and stable task ids.

A task is one level played from one seed; its id reads ``<level>/<seed>``, e.g.
``GoToRedBall/3``. Seeds fall into three disjoint ranges (:data:`SPLIT_SEEDS`), so a
seed's range is its split, and a split's list takes the first seeds of its range from
every offered level, round-robin (any prefix mixes the levels).

AgentGym's BabyAI server plays ``data_idx`` as level ``data_idx % 40`` of its list (the
order of :data:`LEVELS`) from seed ``data_idx // 40``: :func:`agentgym_task_id`.
"""

from __future__ import annotations

from agentgym.contract.core import Task
from agentgym.contract.errors import UnknownTask
from agentgym.contract.inputs import decimal

LEVELS: tuple[str, ...] = (
    "GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObjS6", "GoToLocalS8N7",
    "GoToObjMazeS7", "GoToImpUnlock", "GoToSeqS5R2", "GoToRedBlueBall", "GoToDoor",
    "GoToObjDoor", "Open", "OpenRedDoor", "OpenDoorLoc", "OpenRedBlueDoorsDebug",
    "OpenDoorsOrderN4Debug", "Pickup", "UnblockPickup", "PickupLoc", "PickupDistDebug",
    "PickupAbove", "PutNextLocalS6N4", "PutNextS7N4Carrying", "Unlock", "UnlockLocalDist",
    "KeyInBox", "UnlockPickupDist", "BlockedUnlockPickup", "UnlockToUnlock", "ActionObjDoor",
    "FindObjS7", "KeyCorridorS6R3", "OneRoomS20", "MoveTwoAcrossS8N9", "SynthS5R2",
    "SynthLoc", "SynthSeq", "MiniBossLevel", "BossLevel", "BossLevelNoUnlock",
)  # fmt: skip
"""AgentGym's 40 levels, in its order (``all_levels`` of agentenv-babyai, 1-based there)."""

EXCLUDED: dict[str, str] = {
    "GoToImpUnlock": "the bot's replanning loops for ever on seeds 6 and 14",
    "OpenDoorsOrderN4Debug": (
        "the bot fails 18 of 20 seeds: minigrid 3.2.0's strict 'A, then B' check verifies the "
        "toggle that opens A against B too, and fails the mission at the right first door"
    ),
    "PutNextS7N4Carrying": "the bot starts out carrying the object and gives up ('nothing left to explore')",
    "KeyInBox": "the key is inside a box and the bot never opens boxes",
    "UnlockToUnlock": "the bot's replanning loops for ever on 6 of 20 seeds",
    "SynthS5R2": "on seed 18 the bot uses up the level's 150 moves",
}
"""Levels left out of the splits, and why: BabyAI's bot (the expert) does not solve every
one of seeds 0-19 within the turn limit (minigrid's docstring of ``BabyAIBot`` names the
two it cannot solve at all). Their tasks stay playable by id and through AgentGym's
``data_idx``."""

OFFERED: tuple[str, ...] = tuple(level for level in LEVELS if level not in EXCLUDED)

_GYM_VERSIONS = {"GoToObjS6": "v1"}
"""minigrid 3 refuses ``BabyAI-GoToObjS6-v0`` (AgentGym's name) as deprecated: use ``-v1``."""

SPLITS = ("train", "validation", "test")
SPLIT_SEEDS = {"train": 0, "validation": 500_000, "test": 1_000_000}
"""The first seed of each split's range; a range ends where the next begins (test: never)."""


def gym_id(level: str) -> str:
    """The Gymnasium id minigrid registers ``level`` under."""
    return f"BabyAI-{level}-{_GYM_VERSIONS.get(level, 'v0')}"


def split_of(seed: int) -> str:
    return next(split for split in reversed(SPLITS) if seed >= SPLIT_SEEDS[split])


def make_task(level: str, seed: int) -> Task:
    meta = {"level": level, "seed": seed, "agentgym_data_idx": seed * len(LEVELS) + LEVELS.index(level)}
    return Task(task_id=f"{level}/{seed}", split=split_of(seed), meta=meta)


def build_split(split: str, per_level: int) -> list[Task]:
    """``per_level`` seeds of every offered level from ``split``'s range, round-robin."""
    first = SPLIT_SEEDS[split]
    return [make_task(level, first + n) for n in range(per_level) for level in OFFERED]


def parse_task_id(task_id: str) -> Task:
    """The task ``<level>/<seed>`` names (any of the 40 levels, any seed); UnknownTask else."""
    level, _, seed = task_id.rpartition("/")
    number = decimal(seed)
    if level not in LEVELS or number is None:
        raise UnknownTask(
            f"unknown BabyAI task id {task_id!r} (expected '<level>/<seed>', e.g. 'GoToRedBall/3')"
        )
    return make_task(level, number)


def agentgym_task_id(data_idx: int) -> str:
    """The task AgentGym's BabyAI server plays for ``data_idx``."""
    return f"{LEVELS[data_idx % len(LEVELS)]}/{data_idx // len(LEVELS)}"
