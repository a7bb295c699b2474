"""Held-out success before and after RL, with 95% intervals.

The trainer evaluates the same frozen test tasks greedily right after behaviour cloning
("after BC"; a run without cloning evaluates the untrained policy before its first RL step,
as step 0 with phase ``start``) and at the end of the run ("after RL"). Each evaluation records one outcome
(1 solved, 0 not) per task, so the two can be compared task by task: the gain's interval
is over paired differences, which cancels how hard each task is. Several runs (seeds)
pool their pairs (task × seed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

Z95 = NormalDist().inv_cdf(0.975)
"""Normal approximation: with 32+ pairs the t quantile (2.04 at 31 df) is within 4% of it."""

BEFORE_AFTER_FILE = "heldout.json"
"""The before/after comparison, written into the run folder at the end of a run."""

BEFORE_PHASES = frozenset({"bc", "start"})
"""Phases whose evaluation is the "before" of RL: the end of behaviour cloning, or, with no
cloning, step 0 (the untrained policy)."""


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    n: int

    def points(self) -> str:
        """As percentage points: ``52.1 [43.9, 60.3]``."""
        return f"{100 * self.mean:.1f} [{100 * self.low:.1f}, {100 * self.high:.1f}]"


def mean_interval(values: Sequence[float], bounds: tuple[float, float] = (0.0, 1.0)) -> Estimate:
    """The mean of ``values`` with its 95% normal interval, cut to ``bounds``, the range the
    mean can take (a success rate: ``values`` are 0/1; a paired gain: -1..1)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, mean, mean, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return Estimate(mean, max(bounds[0], mean - half), min(bounds[1], mean + half), n)


def outcomes_by_phase(records: Iterable[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """The last evaluation before RL (:data:`BEFORE_PHASES`) and the last one after it, from
    a run's metrics records (``eval_outcomes``: task id -> 1/0)."""
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for record in records:
        outcomes = record.get("eval_outcomes")
        if outcomes:
            if record.get("phase") in BEFORE_PHASES:
                before = dict(outcomes)
            else:
                after = dict(outcomes)
    return before, after


@dataclass(frozen=True)
class BeforeAfter:
    after_bc: Estimate
    """The "before": after behaviour cloning, or the untrained policy in a run without it."""
    after_rl: Estimate
    gain: Estimate
    """After RL minus after BC, paired per task (and seed)."""

    def to_dict(self) -> dict[str, Any]:
        return {key: asdict(value) for key, value in vars(self).items()}


def compare(runs: Sequence[tuple[Mapping[str, float], Mapping[str, float]]]) -> BeforeAfter:
    """Pool ``(before, after)`` outcome maps of one or more runs over the tasks both hold."""
    pairs = [
        (before[task], after[task]) for before, after in runs for task in sorted(before) if task in after
    ]
    if not pairs:
        raise ValueError("no task was evaluated both after behaviour cloning and after RL")
    before_values = [b for b, _ in pairs]
    after_values = [a for _, a in pairs]
    return BeforeAfter(
        after_bc=mean_interval(before_values),
        after_rl=mean_interval(after_values),
        gain=mean_interval([a - b for b, a in pairs], bounds=(-1.0, 1.0)),
    )


def rows(result: BeforeAfter, cloned: bool = True) -> list[tuple[str, str]]:
    """The table's rows: label, percentage points with the 95% interval. ``cloned``: the
    "before" is the end of behaviour cloning (else the untrained policy)."""
    before, short = ("after behaviour cloning", "after BC") if cloned else ("before RL (untrained)", "before")
    return [
        (f"held-out success {before}", result.after_bc.points()),
        ("held-out success after RL", result.after_rl.points()),
        (f"gain (after RL - {short}, paired)", result.gain.points()),
    ]


def save(run_dir: Path, result: BeforeAfter, tasks: Sequence[str]) -> Path:
    path = run_dir / BEFORE_AFTER_FILE
    path.write_text(json.dumps({**result.to_dict(), "tasks": list(tasks)}, indent=2) + "\n")
    return path
