"""What ``eval`` and ``collect`` show: a progress bar with an ETA, and the results as tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from agentgym.cli.common import console
from agentgym.progress import clock
from agentgym.progress import progress as progress_display

if TYPE_CHECKING:
    from pathlib import Path

    from agentgym.records.trajectory import Trajectory


class EtaColumn(ProgressColumn):
    """Time left at the average pace since the start, counting only episodes run now (not
    those a resumed eval found done). Rich's own estimate needs two episodes finished within
    its 30 s window, so a slow model's eval showed ``-:--:--`` for its whole run."""

    def render(self, task: Task) -> Text:
        ran = task.completed - task.fields.get("resumed", 0)
        if task.total is None or not ran or not task.elapsed:
            return Text("eta -:--:--", style="progress.remaining")
        left = task.elapsed / ran * (task.total - task.completed)
        return Text(f"eta {clock(left)}", style="progress.remaining")


class EpisodeProgress(NamedTuple):
    """A progress bar and the callbacks that drive it."""

    bar: Any
    on_plan: Callable[[int, int], None]
    """``(total, already_done)``, once."""
    on_episode: Callable[[Trajectory], None]
    """After each episode played."""
    on_resume: Callable[[list[Trajectory]], None]
    """With the episodes an earlier run finished, which count in the tally too."""


def episode_progress(console: Console = console) -> EpisodeProgress:
    """A progress bar (plain lines when the output is not a terminal, :mod:`agentgym.progress`)
    and the callbacks that drive it; its line tallies successes and errors over every
    episode, resumed ones included."""
    progress = progress_display(
        console,
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        EtaColumn(),
    )
    bar = progress.add_task("episodes", total=None)
    tally = {"success": 0, "errored": 0}

    def on_plan(total: int, done: int) -> None:
        progress.update(bar, total=total, completed=done, resumed=done)

    def count(trajectories: list[Trajectory], advance: int) -> None:
        tally["success"] += sum(t.success for t in trajectories)
        tally["errored"] += sum(t.errored for t in trajectories)
        description = f"success {tally['success']}  errors {tally['errored']}"
        progress.update(bar, advance=advance, description=description)

    return EpisodeProgress(
        progress, on_plan, lambda trajectory: count([trajectory], 1), lambda resumed: count(resumed, 0)
    )


def show_value(value: Any) -> str:
    """A results value as a table cell."""
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def results_table(results: dict[str, Any]) -> Table:
    table = Table("metric", "value", title=f"{results['env']} / {results['split']} / {results['policy']}")
    rows = ["episodes", "tasks", "k", "seed", "success_rate", "success_rate_excluding_errors", "mean_score"]
    rows += [
        "avg_at_k",
        "mean_turns",
        "invalid_reply_rate",
        "rejected_action_rate",
        "errored",
        "resumed",
        "ran",
        "episodes_per_min",
        "generated_tokens_per_s",
    ]
    for key in rows:
        table.add_row(key, show_value(results[key]))
    for j, value in results["pass_at_k"].items():
        table.add_row(f"pass@{j}", show_value(value))
    if results["error_kinds"]:
        table.add_row("error kinds", ", ".join(f"{kind} x{n}" for kind, n in results["error_kinds"].items()))
    return table


def families_table(results: dict[str, Any]) -> Table:
    """One row per challenge (task family: the task id up to its first ``/``)."""
    columns = {  # short headers: the table fits 80 columns
        "episodes": "episodes",
        "success_rate": "success",
        "mean_score": "score",
        "mean_turns": "turns",
        "invalid_reply_rate": "unparsed",
        "rejected_action_rate": "rejected",
        "errored": "errored",
    }
    table = Table(
        title="per challenge (unparsed: replies that named no action; rejected: actions the env "
        "refused or did not list)"
    )
    table.add_column("challenge", no_wrap=True)  # a name stays whole, searchable in a log
    for header in columns.values():
        table.add_column(header, min_width=len(header))  # a narrow terminal wraps names, not these
    for family, figures in results["by_family"].items():
        table.add_row(family, *(show_value(figures[key]) for key in columns))
    return table


def print_critic_results(env: str, split: str, results: dict[str, Any], out: Path) -> None:
    """``eval --critic``'s figures, then where they were written."""
    from agentgym.play.critic_eval import CRITIQUES_FILE
    from agentgym.play.evaluation import RESULTS_FILE

    table = Table(
        "metric", "value", title=f"{env} / {split} / {results['policy']} + critic {results['critic']}"
    )
    for key, value in results.items():
        if not isinstance(value, str):
            table.add_row(key, show_value(value))
    console.print(table)
    console.print(f"results: {out / RESULTS_FILE}\ncritiques: {out / CRITIQUES_FILE}")
