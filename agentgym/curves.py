"""The curves a run's metrics are drawn as, in ``curves.png`` and the viewer alike: which
keys share a panel, which are rates on a 0..1 axis, which split by training phase.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

PANELS = (
    ("train success", ("success_rate",)),
    (
        "reward (env's score; the run's own reward where a hook set one)",
        ("reward_mean", "shaped_reward_mean"),
    ),
    ("held-out success", ("eval_success_rate", "val_success_rate")),
    ("max turns (schedule)", ("max_turns",)),
    ("BAPO bounds", ("clip_low", "clip_high")),
    ("positive share ρ", ("positive_share",)),
    ("entropy", ("entropy",)),
    ("invalid actions (share of turns)", ("invalid_share", "eval_invalid_share")),
    ("loss", ("loss",)),
    ("staleness (policy versions)", ("staleness_mean", "staleness_max")),
    ("importance ratio π_θ/π_behaviour", ("ratio_p05", "ratio_p50", "ratio_p95")),
    ("approx. KL, behaviour → current policy", ("approx_kl",)),
    ("tokens held by the clip (share)", ("clip_frac_low", "clip_frac_high")),
    ("gradient norm, before clipping", ("grad_norm",)),
    ("learning rate", ("lr",)),
)
RATES = frozenset(
    {
        "success_rate",
        "eval_success_rate",
        "val_success_rate",
        "positive_share",
        "invalid_share",
        "eval_invalid_share",
    }
)
"""Shares in [0, 1]: a panel of only these is drawn on a 0..1 axis, so a flat 0.125 reads as
low rather than filling the panel, and runs compare at a glance."""
BY_PHASE = frozenset({"loss"})
"""Keys drawn as one line per training phase (``bc``, ``rl``, ``critique-*``), in
``curves.png`` each on its own axes: a behaviour cloning loss (NLL) and an RL loss are
different quantities."""
OUTCOMES = {"eval_success_rate": "eval_outcomes", "val_success_rate": "val_outcomes"}
"""Held-out rates and the per-task outcomes they were computed from (their intervals)."""


def series(records: Sequence[dict[str, Any]], key: str) -> list[tuple[str, list[tuple[int, float]]]]:
    """``[(label, [(step, value), ...])]`` for ``key``: one series, or one per phase (in
    order of first appearance) for :data:`BY_PHASE` keys, labelled ``key · phase``."""
    points = [(r, (r["step"], r[key])) for r in records if r.get(key) is not None and "step" in r]
    if key not in BY_PHASE:
        return [(key, [p for _, p in points])] if points else []
    phases = dict.fromkeys(str(r.get("phase", "")) for r, _ in points)
    return [
        (f"{key} · {phase}", [p for r, p in points if str(r.get("phase", "")) == phase]) for phase in phases
    ]


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate: unlike the Wald interval it keeps a width at 0 and
    at 1 (3 of 3 is [0.44, 1.0], not [1.0, 1.0])."""
    if n <= 0:
        return 0.0, 1.0
    rate = successes / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def held_out_interval(record: dict[str, Any], key: str) -> tuple[float, float]:
    """The 95% Wilson interval of the held-out rate ``key`` (:data:`OUTCOMES`) in ``record``,
    from the per-task outcomes it was computed from (a rate without them counts as one task)."""
    outcomes = record.get(OUTCOMES[key])
    if isinstance(outcomes, dict) and outcomes and all(_is_number(v) for v in outcomes.values()):
        return wilson_interval(sum(outcomes.values()), len(outcomes))
    return wilson_interval(record[key], 1)


def with_intervals(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` plus ``KEY_interval: [low, high]`` for each held-out rate it holds (what the
    viewer's dashboard draws as error bars)."""
    keys = [key for key in OUTCOMES if _is_number(record.get(key))]
    return record | {f"{key}_interval": list(held_out_interval(record, key)) for key in keys}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
