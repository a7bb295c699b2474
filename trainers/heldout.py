"""Held-out success before and after RL, with 95% intervals that count every source of noise.

The trainer evaluates the same frozen test tasks greedily right after behaviour cloning
("after BC"; a run without cloning evaluates the untrained policy before its first RL step,
as step 0 with phase ``start``) and at the end of the run ("after RL"). Each evaluation records one outcome
(1 solved, 0 not) per task, so the two can be compared task by task: the gain is after RL
minus after BC over the tasks both evaluated, which cancels how hard each task is.

Outcomes are not independent: the tasks of one seed share one trained model, and the same
tasks recur in every seed. So each figure carries three intervals (``docs/protocol.md``):

* **per seed** (:func:`seed_t_interval`): each seed's mean, then a Student-t interval over
  those means (``n_seeds - 1`` degrees of freedom). Undefined with one seed.
* **cluster bootstrap** (:func:`cluster_bootstrap`): seeds resampled with replacement and
  tasks resampled with replacement, the same resampled tasks for every resampled seed;
  the percentile interval of the resampled means. With one seed it resamples tasks only,
  and seed variance is not in it (:data:`ONE_SEED_NOTE`).
* **per episode** (:func:`mean_interval`): the normal interval over every task x seed
  outcome (or paired difference) pooled as if independent; too narrow, kept as a
  secondary figure.

A claim uses the **wider** of the first two (:attr:`Summary.claim`).
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

CONFIDENCE = 0.95
Z95 = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
"""The per-episode interval's normal quantile."""

DEFAULT_RESAMPLES = 2000
"""Cluster bootstrap resamples: the interval's ends move by well under a point between
bootstrap seeds at 32 tasks x 3 seeds."""
BOOTSTRAP_SEED = 0
"""The bootstrap's RNG seed: the same data always give the same interval."""

ONE_SEED_NOTE = "one seed: the interval resamples tasks; seed variance is not in it"

BEFORE_AFTER_FILE = "heldout.json"
"""The before/after comparison, written into the run folder at the end of a run."""

BEFORE_PHASES = frozenset({"bc", "start"})
"""Phases whose evaluation is the "before" of RL: the end of behaviour cloning, or, with no
cloning, step 0 (the untrained policy)."""

Bounds = tuple[float, float]
RATE: Bounds = (0.0, 1.0)
"""What a success rate can take."""
GAIN: Bounds = (-1.0, 1.0)
"""What a paired gain can take."""


# ----- intervals -----------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low

    def points(self) -> str:
        """As percentage points: ``[43.9, 60.3]``."""
        return f"[{100 * self.low:.1f}, {100 * self.high:.1f}]"


@dataclass(frozen=True)
class Estimate:
    """A mean with its per-episode normal interval over ``n`` values."""

    mean: float
    low: float
    high: float
    n: int

    def points(self) -> str:
        """As percentage points: ``52.1 [43.9, 60.3]``."""
        return f"{100 * self.mean:.1f} [{100 * self.low:.1f}, {100 * self.high:.1f}]"


def mean_interval(values: Sequence[float], bounds: Bounds = RATE) -> Estimate:
    """The mean of ``values`` with its 95% normal interval, cut to ``bounds``, the range the
    mean can take (a success rate: ``values`` are 0/1; a paired gain: -1..1). Treats the
    values as independent: the per-episode interval."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, mean, mean, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return Estimate(mean, max(bounds[0], mean - half), min(bounds[1], mean + half), n)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` (a whole number >= 1) degrees of
    freedom, e.g. ``t_quantile(0.975, 2) == 4.3027``: the root, by bisection, of the exact
    closed-form t distribution for whole ``df``."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, not {df}")
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, not {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    target = 2.0 * p - 1.0  # P(|T| <= t)
    low, high = 0.0, 1.0
    while _t_central_mass(high, int(df)) < target:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if _t_central_mass(middle, int(df)) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _t_central_mass(t: float, df: int) -> float:
    """P(|T| <= t), T Student's t with whole ``df``: with θ = atan(t/√df), a finite series in
    cos θ (the even and odd cases of the classical closed form)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s, c = math.cos(theta) ** 2, math.sin(theta), math.cos(theta)
    if df % 2 == 0:  # sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ...), up to cos^(df-2)
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= c2 * (k - 1) / k
            total += term
        return s * total
    if df == 1:
        return 2.0 * theta / math.pi
    # odd: 2/π (θ + sin θ (cos θ + 2/3 cos³θ + 2·4/(3·5) cos⁵θ + ...)), up to cos^(df-2)
    term = total = c
    for k in range(3, df - 1, 2):
        term *= c2 * (k - 1) / k
        total += term
    return 2.0 / math.pi * (theta + s * total)


def seed_t_interval(seed_means: Sequence[float], bounds: Bounds = RATE) -> Interval | None:
    """The 95% Student-t interval over the seeds' means (``n_seeds - 1`` degrees of
    freedom), centred on their mean and cut to ``bounds``; None with fewer than two seeds."""
    n = len(seed_means)
    if n < 2:
        return None
    mean = sum(seed_means) / n
    sd = math.sqrt(sum((m - mean) ** 2 for m in seed_means) / (n - 1))
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return Interval(max(bounds[0], mean - half), min(bounds[1], mean + half))


def cluster_bootstrap(
    cells: Sequence[Mapping[str, float]], resamples: int = DEFAULT_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> Interval:
    """The 95% percentile interval of the mean over ``cells`` (one task -> value map per
    seed) under a two-way cluster bootstrap: each resample draws the seeds with replacement
    and the tasks with replacement, the same drawn tasks for every drawn seed, and takes the
    mean of the drawn (seed, task) values a seed holds. One seed: the tasks only. The RNG
    is ``random.Random(seed)``, so the same data give the same interval."""
    grid_cells = [dict(c) for c in cells if c]
    if not grid_cells:
        raise ValueError("no values to resample")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, not {resamples}")
    tasks = sorted(set().union(*grid_cells))
    grid = [[c.get(task) for task in tasks] for c in grid_cells]
    rng = random.Random(seed)
    n_seeds, n_tasks = len(grid), len(tasks)
    seed_range, task_range = range(n_seeds), range(n_tasks)
    means = []
    for _ in range(resamples):
        drawn_seeds = Counter(rng.choices(seed_range, k=n_seeds)) if n_seeds > 1 else {0: 1}
        drawn_tasks = Counter(rng.choices(task_range, k=n_tasks)).items()
        total = count = 0.0
        for s, seed_weight in drawn_seeds.items():
            row = grid[s]
            for t, task_weight in drawn_tasks:
                value = row[t]
                if value is not None:
                    weight = seed_weight * task_weight
                    total += weight * value
                    count += weight
        if count:  # tasks not every seed evaluated can leave a resample empty: skipped
            means.append(total / count)
    means.sort()
    return Interval(_quantile(means, (1 - CONFIDENCE) / 2), _quantile(means, (1 + CONFIDENCE) / 2))


def _quantile(ordered: Sequence[float], p: float) -> float:
    """The ``p`` quantile of sorted values, linear between order statistics."""
    position = (len(ordered) - 1) * p
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def wider(per_seed: Interval | None, bootstrap: Interval) -> Interval:
    """The claim interval: the wider of the two (the bootstrap where there is no per-seed
    interval, i.e. one seed)."""
    return per_seed if per_seed is not None and per_seed.width > bootstrap.width else bootstrap


# ----- one figure, several seeds -------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """One figure (a success rate or a paired gain) over tasks x seeds, with its intervals."""

    mean: float
    """Over every (task, seed) value."""
    claim: Interval
    """What a claim uses: the wider of ``per_seed`` and ``bootstrap``."""
    per_seed: Interval | None
    """Student-t over the seeds' means; None with one seed."""
    bootstrap: Interval
    """Two-way cluster bootstrap over tasks and seeds (tasks only with one seed)."""
    per_episode: Estimate
    """Normal interval with every (task, seed) value taken as independent: secondary."""
    seed_means: tuple[float, ...]
    n: int
    """(task, seed) values."""

    def points(self) -> str:
        """The mean with the claim interval, in percentage points: ``52.1 [43.9, 60.3]``."""
        return f"{100 * self.mean:.1f} {self.claim.points()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "low": self.claim.low,
            "high": self.claim.high,
            "n": self.n,
            "claim_from": "per_seed_t" if self.claim is self.per_seed else "cluster_bootstrap",
            "per_seed_t": asdict(self.per_seed) if self.per_seed is not None else None,
            "cluster_bootstrap": asdict(self.bootstrap),
            "per_episode": asdict(self.per_episode),
            "seed_means": list(self.seed_means),
        }


def summarise(
    cells: Sequence[Mapping[str, float]],
    bounds: Bounds = RATE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Summary:
    """``cells``: one task -> value map per seed (a seed with none is left out)."""
    cells = [c for c in cells if c]
    if not cells:
        raise ValueError("no values to estimate from")
    values = [v for c in cells for v in c.values()]
    seed_means = tuple(sum(c.values()) / len(c) for c in cells)
    per_seed = seed_t_interval(seed_means, bounds)
    bootstrap = cluster_bootstrap(cells, resamples, seed)
    return Summary(
        mean=sum(values) / len(values),
        claim=wider(per_seed, bootstrap),
        per_seed=per_seed,
        bootstrap=bootstrap,
        per_episode=mean_interval(values, bounds),
        seed_means=seed_means,
        n=len(values),
    )


# ----- before and after RL -------------------------------------------------------------


PANELS = {"validation": "val_outcomes", "test": "eval_outcomes"}
"""Held-out panel -> the metrics records' key of its per-task outcomes (task id -> 1/0):
where choices are made, then the frozen test panel."""


def evaluations(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Every held-out evaluation of a run: panel -> step -> task id -> outcome."""
    return {
        panel: {str(r["step"]): dict(r[key]) for r in records if r.get(key)} for panel, key in PANELS.items()
    }


def outcomes_by_phase(
    records: Iterable[Mapping[str, Any]], key: str = "eval_outcomes"
) -> tuple[dict[str, float], dict[str, float]]:
    """The last evaluation before RL (:data:`BEFORE_PHASES`) and the last one after it, from
    a run's metrics records (``key``: task id -> 1/0; ``eval_outcomes`` for the test panel,
    ``val_outcomes`` for validation)."""
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for record in records:
        outcomes = record.get(key)
        if outcomes:
            if record.get("phase") in BEFORE_PHASES:
                before = dict(outcomes)
            else:
                after = dict(outcomes)
    return before, after


@dataclass(frozen=True)
class BeforeAfter:
    after_bc: Summary
    """The "before": after behaviour cloning, or the untrained policy in a run without it."""
    after_rl: Summary
    gain: Summary
    """After RL minus after BC, paired per task within each seed."""
    seeds: int
    """Runs that evaluated a task both before and after RL."""
    tasks: int
    """Distinct tasks among them."""
    resamples: int
    bootstrap_seed: int = BOOTSTRAP_SEED

    @property
    def note(self) -> str | None:
        """What the intervals leave out: with one seed, seed variance."""
        return ONE_SEED_NOTE if self.seeds == 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "after_bc": self.after_bc.to_dict(),
            "after_rl": self.after_rl.to_dict(),
            "gain": self.gain.to_dict(),
            "seeds": self.seeds,
            "resamples": self.resamples,
            "bootstrap_seed": self.bootstrap_seed,
            "confidence": CONFIDENCE,
            "note": self.note,
        }


def compare(
    runs: Sequence[tuple[Mapping[str, float], Mapping[str, float]]],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> BeforeAfter:
    """``(before, after)`` outcome maps of one run per seed, over the tasks both hold."""
    paired = []
    for before, after in runs:
        tasks = [task for task in sorted(before) if task in after]
        if tasks:
            paired.append(({t: before[t] for t in tasks}, {t: after[t] for t in tasks}))
    if not paired:
        raise ValueError("no task was evaluated both after behaviour cloning and after RL")
    gains = [{t: a[t] - b[t] for t in b} for b, a in paired]
    return BeforeAfter(
        after_bc=summarise([b for b, _ in paired], RATE, resamples, seed),
        after_rl=summarise([a for _, a in paired], RATE, resamples, seed),
        gain=summarise(gains, GAIN, resamples, seed),
        seeds=len(paired),
        tasks=len({t for b, _ in paired for t in b}),
        resamples=resamples,
        bootstrap_seed=seed,
    )


def rows(result: BeforeAfter, cloned: bool = True) -> list[tuple[str, str, str]]:
    """The table's rows: label, percentage points with the claim interval, and the
    per-episode interval (around the same mean). ``cloned``: the "before" is the end of
    behaviour cloning (else the untrained policy)."""
    before, short = ("after behaviour cloning", "after BC") if cloned else ("before RL (untrained)", "before")
    labels = (f"held-out success {before}", "held-out success after RL", f"gain (after RL - {short}, paired)")
    figures = (result.after_bc, result.after_rl, result.gain)
    return [
        (label, figure.points(), Interval(figure.per_episode.low, figure.per_episode.high).points())
        for label, figure in zip(labels, figures, strict=True)
    ]


def caption(result: BeforeAfter) -> str:
    """What the claim interval is, for under the table."""
    if result.seeds == 1:
        return f"95% interval: cluster bootstrap over tasks ({ONE_SEED_NOTE}); per-episode: secondary"
    return (
        f"95% interval: the wider of the per-seed t ({result.seeds} seeds) and the task x seed "
        "cluster bootstrap; per-episode: secondary"
    )


def save(run_dir: Path, result: BeforeAfter, tasks: Sequence[str]) -> Path:
    path = run_dir / BEFORE_AFTER_FILE
    path.write_text(json.dumps({**result.to_dict(), "tasks": list(tasks)}, indent=2) + "\n")
    return path
