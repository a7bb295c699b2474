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
    ("KL, behaviour → current policy (k3)", ("approx_kl",)),
    ("KL to the reference policy (k3)", ("kl_ref",)),
    ("reply length (sampled tokens per turn)", ("reply_tokens_mean",)),
    ("episodes without advantage (share)", ("zero_advantage_share",)),
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
        "zero_advantage_share",
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


X_AXES = {
    "step": "step",
    "samples": "episodes played",
    "tokens": "tokens sampled",
    "wall": "wall clock (minutes)",
}
"""What a curve's x axis can count, with its label: training steps, or what they cost."""
_CUMULATIVE = {"samples": "episodes", "tokens": "generated_tokens"}


def x_positions(records: Sequence[dict[str, Any]], axis: str = "step") -> dict[int, float]:
    """Each step's place on ``axis`` (:data:`X_AXES`): the step; the episodes or sampled
    tokens played up to the end of it; or the minutes from the run's start to its end.
    ValueError for another axis."""
    if axis not in X_AXES:
        raise ValueError(f"unknown x axis {axis!r}; choose one of {', '.join(X_AXES)}")
    stepped = [r for r in records if isinstance(r.get("step"), int)]
    if axis == "step":
        return {r["step"]: float(r["step"]) for r in stepped}
    positions: dict[int, float] = {}
    if axis == "wall":
        ends = [(r["finished_at"], r.get("step_s", 0.0)) for r in stepped if "finished_at" in r]
        start = min((end - took for end, took in ends), default=0.0)
        for record in stepped:
            last = positions.get(record["step"], max(positions.values(), default=0.0))
            positions[record["step"]] = (
                (record["finished_at"] - start) / 60 if "finished_at" in record else last
            )
        return positions
    total = 0.0
    for record in stepped:
        total += record.get(_CUMULATIVE[axis]) or 0
        positions[record["step"]] = total
    return positions


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
