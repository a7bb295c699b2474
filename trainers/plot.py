"""``agentgym plot RUN_DIR``: training curves from metrics.jsonl to one PNG.

The viewer's dashboard draws the same panels (``/api/info`` hands it :data:`PANELS`,
:data:`RATES` and :data:`BY_PHASE`), so the PNG and the page agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentgym.records.curves import (
    BY_PHASE,
    OUTCOMES,
    PANELS,
    RATES,
    X_AXES,
    held_out_interval,
    series,
    x_positions,
)

RATE_LIMITS = (-0.02, 1.02)
"""The 0..1 axis, with room for markers at 0 and 1."""


def plot_run(run_dir: str | Path, out: str | Path | None = None, x: str = "step") -> Path:
    """Draw every panel that has data and moves; return the PNG's path (default
    RUN_DIR/curves.png). The x axis counts ``x`` (:data:`~agentgym.records.curves.X_AXES`: steps,
    integers; episodes played; tokens sampled; wall-clock minutes); rate panels span 0..1;
    a dashed line marks where RL starts; held-out success carries its Wilson 95%
    intervals; a loss gets its own axes per phase; panels whose every value is one number
    are named under the title instead of drawn."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    from agentgym.records.run_folder import MetricsLog

    run_dir = Path(run_dir)
    records = MetricsLog(run_dir / "metrics.jsonl").read()
    if not records:
        raise FileNotFoundError(f"no metrics in {run_dir / 'metrics.jsonl'}")
    position = x_positions(records, x)
    panels, constant = drawn_panels(records)
    columns = 2
    rows = max(1, (len(panels) + columns - 1) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(10, 2.8 * rows + 0.6), squeeze=False)
    rl_start = next((r["step"] for r in records if r.get("phase") == "rl"), None)
    for axis, (title, keys, lines) in zip(axes.flat, panels, strict=False):
        _draw(axis, title, keys, lines, records, rl_start, (x, position))
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    heading = _title(run_dir) + (f"\nconstant throughout: {'; '.join(constant)}" if constant else "")
    figure.suptitle(heading)
    figure.tight_layout(rect=(0, 0, 1, 1 - (0.25 + 0.2 * heading.count("\n")) / figure.get_figheight()))
    path = Path(out) if out else run_dir / "curves.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


Line = tuple[str, list[tuple[int, float]]]


def drawn_panels(
    records: list[dict[str, Any]],
) -> tuple[list[tuple[str, tuple[str, ...], list[Line]]], list[str]]:
    """The panels to draw, ``(title, keys, lines)``, a per-phase key split into one panel per
    phase; and the panels left out because every value is the same (``"title value"``)."""
    panels, constant = [], []
    for title, keys in PANELS:
        lines = [line for key in keys for line in series(records, key)]
        if not lines:
            continue
        split = len(lines) > 1 and set(keys) <= BY_PHASE
        for panel_title, panel_lines in (
            [(label, [(label, pts)]) for label, pts in lines] if split else [(title, lines)]
        ):
            values = {value for _, points in panel_lines for _, value in points}
            if len(values) == 1 and sum(len(points) for _, points in panel_lines) > 1:
                constant.append(f"{panel_title} {values.pop():g}")
            else:
                panels.append((panel_title, keys, panel_lines))
    return panels, constant


def _draw(
    axis: Any,
    title: str,
    keys: tuple[str, ...],
    lines: list[Line],
    records: list[dict],
    rl_start: int | None,
    x_axis: tuple[str, dict[int, float]],
) -> None:
    from matplotlib.ticker import MaxNLocator

    x, position = x_axis
    for label, points in lines:
        steps, values = zip(*points, strict=True)
        where = [position.get(step, float(step)) for step in steps]
        if label in OUTCOMES:  # held-out success with its 95% interval
            at_step: dict[int, dict[str, Any]] = {}
            for record in records:  # the first record of each step that holds the rate
                if label in record:
                    at_step.setdefault(record.get("step"), record)
            low, high = zip(*(held_out_interval(at_step[step], label) for step in steps), strict=True)
            errors = [
                [v - lo for v, lo in zip(values, low, strict=True)],
                [hi - v for v, hi in zip(values, high, strict=True)],
            ]
            axis.errorbar(where, values, yerr=errors, marker="o", capsize=3, label=label)
        else:
            axis.plot(where, values, marker="o", label=label)
    first = min(step for _, points in lines for step, _ in points)
    if rl_start is not None and first < rl_start:  # the panel shows steps before RL
        before = max((at for step, at in position.items() if step < rl_start), default=0.0)
        axis.axvline((before + position.get(rl_start, before)) / 2, color="grey", linestyle="--", linewidth=1)
    axis.set_title(title)
    axis.set_xlabel(X_AXES[x] + (f" (RL from step {rl_start})" if rl_start and rl_start > 1 else ""))
    if x != "step":
        return _rate_axis(axis, keys, lines)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.5
    steps = {step for _, points in lines for step, _ in points}
    if len(steps) == 1:  # one step: its neighbours either side, not 3.95..4.05
        axis.set_xlim(min(steps) - 1, min(steps) + 1)
    _rate_axis(axis, keys, lines)


def _rate_axis(axis: Any, keys: tuple[str, ...], lines: list[Line]) -> None:
    """Rates on 0..1; a legend where the panel has several lines."""
    if set(keys) <= RATES:
        axis.set_ylim(*RATE_LIMITS)
    if len(lines) > 1:
        axis.legend(fontsize="small")


def _title(run_dir: Path) -> str:
    config = run_dir / "config.yaml"
    values = (yaml.safe_load(config.read_text()) or {}) if config.is_file() else {}
    what = ", ".join(str(values[k]) for k in ("algo", "env") if values.get(k))
    name = "/".join(run_dir.resolve().parts[-2:])  # seed-3 alone says little
    return name + (f" ({what})" if what else "")
