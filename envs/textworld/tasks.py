"""TextWorld task lists: challenges, difficulty knobs, seeds and stable task ids.

A task is one generated game: ``(challenge, settings, seed)``. Its id reads
``<challenge>/<settings label>/s<seed>``, e.g. ``tw-coin_collector/level2/s7`` or
``tw-cooking/recipe1-take1-go1-open/s1000003``. The id fixes the game: the label spells
out every knob, the seed picks the game, and each split has its own seed range
(:data:`SEED_OFFSETS`): train from 0, validation from 500,000, test from 1,000,000, ood from
1,500,000, each at most :data:`MAX_SPLIT_TASKS` long, so no two splits share a seed, an id
or a game.

``ood`` is the out-of-distribution panel: test's held-out distributions at the next harder
difficulty (:data:`HARDER`), settings a run on its own difficulty never trains on.

Test games come from TextWorld's held-out distributions (unseen foods in tw-cooking and
tw-simple). Validation games of tw-cooking come from TextWorld's ``valid`` distribution
(its own foods and preparations, none of test's), so choices made on validation never
see test's foods; tw-simple has only a train and a test distribution, so its validation
games are drawn from the train one (other seeds, other games).

Split ``s`` of ``n`` tasks is laid out round-robin over the challenges, and each challenge
cycles through its settings variants, so any prefix mixes challenges and growing ``n``
only appends tasks: ids never change meaning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.contract.core import Task
from agentgym.envs.textworld.store import GameSpec

TEST_SEED_OFFSET = 1_000_000
"""Test seeds start here, far above any train or validation seed."""
VALIDATION_SEED_OFFSET = 500_000
"""Validation seeds start here, between train's and test's."""
OOD_SEED_OFFSET = 1_500_000
"""Seeds of the out-of-distribution panel start here, above test's."""
SEED_OFFSETS = {
    "train": 0,
    "validation": VALIDATION_SEED_OFFSET,
    "test": TEST_SEED_OFFSET,
    "ood": OOD_SEED_OFFSET,
}
MAX_SPLIT_TASKS = VALIDATION_SEED_OFFSET
"""Tasks a split holds at most: train's seeds never reach validation's, nor validation's test's."""

SPLITS = ("train", "validation", "test", "ood")
TEXTWORLD_SPLITS = {"train": "train", "validation": "valid", "test": "test", "ood": "test"}
"""The tw-cooking ``split`` setting (TextWorld's food distribution) of each split."""
HELD_BACK = ("test", "ood")
"""The splits drawn from TextWorld's held-out distributions (unseen foods)."""

KNOBS: dict[str, dict[str, Any]] = {
    "tw-coin_collector": {"level": 1},
    "tw-treasure_hunter": {"level": 1},
    "tw-simple": {"rewards": "dense", "goal": "detailed"},
    "tw-cooking": {
        "recipe": 1,
        "take": 1,
        "go": 1,
        "open": False,
        "cook": False,
        "cut": False,
        "drop": False,
    },
}
"""Each challenge's difficulty knobs with their defaults, in the order labels spell them."""

CHOICES: dict[str, tuple[Any, ...]] = {
    "rewards": ("dense", "balanced", "sparse"),
    # tw-simple also has goal="none", left out: the first observation must state the goal.
    "goal": ("detailed", "brief"),
    "go": (1, 6, 9, 12),
}
LEVELS = {"tw-coin_collector": range(1, 301), "tw-treasure_hunter": range(1, 31)}

HARDER = {"easy": "medium", "medium": "hard"}
"""The difficulty of a difficulty's out-of-distribution panel (``ood``): settings variants
never trained on (longer mazes, deeper levels, more ingredients), on held-out seeds."""

DIFFICULTIES: dict[str, dict[str, list[dict[str, Any]]]] = {
    "easy": {
        "tw-coin_collector": [{"level": 1}, {"level": 2}, {"level": 3}],
        "tw-treasure_hunter": [{"level": 1}, {"level": 3}, {"level": 5}],
        "tw-simple": [{"rewards": "dense", "goal": "detailed"}],
        "tw-cooking": [{"recipe": 1, "take": 1}, {"recipe": 1, "take": 1, "open": True}],
    },
    "medium": {
        "tw-coin_collector": [{"level": 5}, {"level": 8}, {"level": 104}],
        "tw-treasure_hunter": [{"level": 11}, {"level": 13}, {"level": 15}],
        "tw-simple": [
            {"rewards": "balanced", "goal": "detailed"},
            {"rewards": "dense", "goal": "brief"},
        ],
        "tw-cooking": [
            {"recipe": 2, "take": 1, "go": 6, "open": True},
            {"recipe": 1, "take": 1, "go": 6, "open": True, "cut": True},
        ],
    },
    "hard": {
        "tw-coin_collector": [{"level": 10}, {"level": 108}, {"level": 206}],
        "tw-treasure_hunter": [{"level": 21}, {"level": 23}, {"level": 25}],
        "tw-simple": [{"rewards": "sparse", "goal": "brief"}],
        "tw-cooking": [
            {"recipe": 2, "take": 2, "go": 9, "open": True, "cook": True, "cut": True},
            {"recipe": 3, "take": 2, "go": 6, "open": True, "cook": True, "cut": True},
        ],
    },
}
"""Settings variants per challenge for each ``difficulty`` (unset knobs take defaults)."""

_LABEL_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def full_settings(challenge: str, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """``knobs`` over the challenge's defaults, validated (ValueError names the problem)."""
    if challenge not in KNOBS:
        raise ValueError(f"unknown TextWorld challenge {challenge!r}; choose from {sorted(KNOBS)}")
    defaults = KNOBS[challenge]
    unknown = set(knobs) - set(defaults)
    if unknown:
        raise ValueError(f"{challenge} has no knob(s) {sorted(unknown)}; knobs: {list(defaults)}")
    settings = {**defaults, **knobs}
    for name, value in settings.items():
        if type(value) is not type(defaults[name]):
            raise ValueError(f"{challenge} knob {name!r} must be {type(defaults[name]).__name__}")
        if name in CHOICES and value not in CHOICES[name]:
            raise ValueError(f"{challenge} knob {name!r} must be one of {CHOICES[name]}")
    if challenge in LEVELS and settings["level"] not in LEVELS[challenge]:
        raise ValueError(f"{challenge} level must be in {LEVELS[challenge]}")
    if challenge == "tw-cooking" and not 0 <= settings["take"] <= settings["recipe"]:
        raise ValueError("tw-cooking needs 0 <= take <= recipe")
    return settings


def settings_label(settings: Mapping[str, Any]) -> str:
    """``level2``, ``dense-detailed``, ``recipe1-take1-go1-open``: every knob, in order."""
    parts = []
    for name, value in settings.items():
        if isinstance(value, bool):
            parts += [name] if value else []
        elif isinstance(value, int):
            parts.append(f"{name}{value}")
        else:
            parts.append(str(value))
    label = "-".join(parts)
    assert _LABEL_RE.match(label), label
    return label


def generator_settings(challenge: str, settings: Mapping[str, Any], split: str) -> dict[str, Any]:
    """What TextWorld's ``make`` gets: the knobs plus the data-split flags it expects."""
    extra: dict[str, Any] = {}
    if challenge == "tw-cooking":
        extra = {"split": TEXTWORLD_SPLITS[split], "recipe_seed": 0}
    elif challenge == "tw-simple":
        extra = {"test": split in HELD_BACK}  # validation: the train distribution (no other)
    return {**settings, **extra}


def build_tasks(
    split: str,
    n: int,
    variants: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[Task]:
    """The first ``n`` tasks of ``split`` over ``variants`` (challenge -> knob dicts)."""
    if split not in SEED_OFFSETS:
        raise ValueError(f"unknown split {split!r}; splits are {list(SPLITS)}")
    if not 0 <= n <= MAX_SPLIT_TASKS:  # more would run one split's seeds into the next's
        raise ValueError(f"a split holds 0 to {MAX_SPLIT_TASKS} tasks, not {n}")
    challenges = list(variants)
    offset = SEED_OFFSETS[split]
    tasks = []
    for index in range(n):
        challenge = challenges[index % len(challenges)]
        options = variants[challenge]
        knobs = full_settings(challenge, options[(index // len(challenges)) % len(options)])
        seed = offset + index
        task_id = f"{challenge}/{settings_label(knobs)}/s{seed}"
        meta = {
            "challenge": challenge,
            "settings": generator_settings(challenge, knobs, split),
            "seed": seed,
        }
        tasks.append(Task(task_id=task_id, split=split, meta=meta))
    return tasks


def game_spec(task: Task) -> GameSpec:
    meta = task.meta
    return GameSpec(task.task_id, meta["challenge"], meta["settings"], meta["seed"])
