"""``agentgym plot RUN_DIR``: training curves from metrics.jsonl to one PNG."""

from __future__ import annotations

from pathlib import Path

PANELS = (
    ("train success", ("success_rate",)),
    ("reward", ("reward_mean",)),
    ("held-out success", ("eval_success_rate",)),
    ("max turns (schedule)", ("max_turns",)),
    ("BAPO bounds", ("clip_low", "clip_high")),
    ("positive share ρ", ("positive_share",)),
    ("entropy", ("entropy",)),
    ("invalid actions (share of turns)", ("invalid_share", "eval_invalid_share")),
    ("loss", ("loss",)),
    ("staleness (policy versions)", ("staleness_mean", "staleness_max")),
    ("importance ratio π_θ/π_behaviour", ("ratio_p05", "ratio_p50", "ratio_p95")),
)


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw every panel that has data; return the PNG's path (default RUN_DIR/curves.png)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

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
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", label=key)
        axis.set_title(title)
        axis.set_xlabel("step")
        if len(keys) > 1:
            axis.legend()
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    figure.tight_layout()
    path = Path(out) if out else run_dir / "curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
