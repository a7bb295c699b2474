"""Horizon schedules: the rollout's max turns at each training step (steps count from 1)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FixedHorizon:
    """The baseline: the same max turns at every step."""

    max_turns: int

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

    def horizon_at(self, step: int) -> int:
        if step < 1:
            raise ValueError("training steps count from 1")
        return self.rounds[min((step - 1) // self.interval, len(self.rounds) - 1)]


def schedule_of(config: Any) -> FixedHorizon | ScalingInterHorizon:
    """The horizon schedule a training config names (``schedule``, ``rounds``, ``interval``,
    ``max_turns``); ValueError for rounds ScalingInter-RL cannot use."""
    if config.schedule == "scaling-inter":
        return ScalingInterHorizon(config.rounds, config.interval)
    return FixedHorizon(config.max_turns)
