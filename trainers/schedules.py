"""Horizon schedules: the rollout's max turns at each training step (steps count from 1).

Each ``schedule`` name is registered where it is built (:func:`horizon_schedule`), so the
config check, the CLI's help and the trainer read one table and never branch on a name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentgym.trainers.registry import registering_in


class HorizonSchedule(Protocol):
    """What the trainer asks of a schedule."""

    @property
    def longest(self) -> int:
        """The longest turn limit it ever sets (what held-out play and curricula plan for)."""
        ...

    def horizon_at(self, step: int) -> int: ...


SCHEDULES: dict[str, Callable[[Any], HorizonSchedule]] = {}
"""The ``schedule`` names, each building its schedule from a training config."""
horizon_schedule = registering_in(SCHEDULES)
"""``@horizon_schedule(name)``: a function of the config that builds ``schedule: name``."""


@dataclass(frozen=True)
class FixedHorizon:
    """The baseline: the same max turns at every step."""

    max_turns: int

    @property
    def longest(self) -> int:
        return self.max_turns

    def horizon_at(self, step: int) -> int:
        return self.max_turns


@dataclass(frozen=True)
class ScalingInterHorizon:
    """ScalingInter-RL (arXiv 2509.08755): ``h(t) = rounds[min(⌊(t-1)/Δ⌋, n-1)]``, i.e. the
    horizon grows through ``rounds`` every ``interval`` (Δ) steps, then stays at the last."""

    rounds: Sequence[int]
    interval: int

    def __post_init__(self) -> None:
        if not self.rounds or any(r < 1 for r in self.rounds):
            raise ValueError("rounds must be a non-empty list of positive turn limits")
        if any(later <= earlier for earlier, later in itertools.pairwise(self.rounds)):
            raise ValueError(
                f"rounds must increase (ScalingInter-RL lengthens the horizon), got {list(self.rounds)}"
            )
        if self.interval < 1:
            raise ValueError("interval must be at least 1 step")

    @property
    def longest(self) -> int:
        return self.rounds[-1]

    def horizon_at(self, step: int) -> int:
        if step < 1:
            raise ValueError("training steps count from 1")
        return self.rounds[min((step - 1) // self.interval, len(self.rounds) - 1)]


@horizon_schedule("fixed")
def fixed(config: Any) -> FixedHorizon:
    return FixedHorizon(config.max_turns)


@horizon_schedule("scaling-inter")
def scaling_inter(config: Any) -> ScalingInterHorizon:
    return ScalingInterHorizon(config.rounds, config.interval)


def schedule_of(config: Any) -> HorizonSchedule:
    """The horizon schedule a training config names (``schedule``, ``rounds``, ``interval``,
    ``max_turns``); ValueError for a name not registered or rounds ScalingInter-RL cannot use."""
    if config.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}")
    return SCHEDULES[config.schedule](config)
