"""``agentgym plot RUN_DIR``: training curves from metrics.jsonl to one PNG.

The viewer's dashboard draws the same panels (``/api/info`` hands it :data:`PANELS`,
:data:`RATES` and :data:`BY_PHASE`), so the PNG and the page agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
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
"""Keys drawn as one line per training phase (``bc``, ``rl``, ``critique-*``): a behaviour
cloning loss (NLL) and an RL loss are different quantities on one axis."""
RATE_LIMITS = (-0.02, 1.02)
"""The 0..1 axis, with room for markers at 0 and 1."""


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


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw every panel that has data; return the PNG's path (default RUN_DIR/curves.png).
    Steps are integers on every x axis; rate panels span 0..1."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from agentgym.trainers.checkpoint import MetricsLog  # imports torch: only when plotting

    run_dir = Path(run_dir)
    records = MetricsLog(run_dir / "metrics.jsonl").read()
    if not records:
        raise FileNotFoundError(f"no metrics in {run_dir / 'metrics.jsonl'}")
    panels = [(title, keys) for title, keys in PANELS if any(k in r for r in records for k in keys)]
    columns = 2
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(10, 2.8 * rows), squeeze=False)
    for axis, (title, keys) in zip(axes.flat, panels, strict=False):
        lines = [line for key in keys for line in series(records, key)]
        for label, points in lines:
            axis.plot(*zip(*points, strict=True), marker="o", label=label)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.5
        steps = {step for _, points in lines for step, _ in points}
        if len(steps) == 1:  # one step: its neighbours either side, not 3.95..4.05
            axis.set_xlim(min(steps) - 1, min(steps) + 1)
        if set(keys) <= RATES:
            axis.set_ylim(*RATE_LIMITS)
        if len(lines) > 1:
            axis.legend()
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    figure.tight_layout()
    path = Path(out) if out else run_dir / "curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
