"""The curves a run's metrics are drawn as, in ``curves.png`` and the viewer alike: which
keys share a panel, which are rates on a 0..1 axis, which split by training phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PANELS = (
    ("train success", ("success_rate",)),
    ("reward", ("reward_mean",)),
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
