"""``agentgym plot RUN_DIR``: training curves from metrics.jsonl to one PNG.

The viewer's dashboard draws the same panels (``/api/info`` hands it :data:`PANELS`,
:data:`RATES` and :data:`BY_PHASE`), so the PNG and the page agree.
"""

from __future__ import annotations

from pathlib import Path

from agentgym.run_folder import PANELS, RATES, series

RATE_LIMITS = (-0.02, 1.02)
"""The 0..1 axis, with room for markers at 0 and 1."""


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw every panel that has data; return the PNG's path (default RUN_DIR/curves.png).
    Steps are integers on every x axis; rate panels span 0..1."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from agentgym.run_folder import MetricsLog

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
