"""Progress that shows in a log file too. On a terminal, rich's live bar; when the output
is a pipe or a file (CI, ``nohup``, a cluster job, ``make demo > log``), rich prints nothing
until the end, so :class:`LineProgress` prints plain lines instead: done of total, what the
caller describes (success so far, a loss), elapsed and ETA, flushed, at most every
``every`` seconds, and a heartbeat line when nothing moved for ``heartbeat`` seconds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import Progress, ProgressColumn

PIPED_WIDTH = 160
"""Columns of output that goes to a file or a pipe. Rich would assume 80 there and cut
table columns to fit (``epis…``); a terminal's own width is used as it is."""


def output_width(stream: TextIO) -> int | None:
    """``stream``'s width for rich: None (the terminal's, or ``COLUMNS``) on a terminal or
    where ``COLUMNS`` is set, else :data:`PIPED_WIDTH`."""
    interactive = getattr(stream, "isatty", lambda: False)()
    return None if interactive or os.environ.get("COLUMNS") else PIPED_WIDTH


def make_console(*, stderr: bool = False) -> Console:
    """A console for output that a person or a log file reads: tables whole either way."""
    return Console(stderr=stderr, width=output_width(sys.stderr if stderr else sys.stdout))


def progress(console: Console, *columns: str | ProgressColumn, disable: bool = False) -> Any:
    """A rich :class:`~rich.progress.Progress` on a terminal, else a :class:`LineProgress`
    (the same calls: ``with``, ``add_task``, ``update``)."""
    if console.is_terminal:
        return Progress(*columns, console=console, disable=disable)
    return LineProgress(console, disable=disable)


class LineProgress:
    """One task's progress as plain, flushed lines (rich's ``Progress`` calls it takes)."""

    def __init__(
        self, console: Console, *, every: float = 10.0, heartbeat: float = 30.0, disable: bool = False
    ):
        self.console, self.every, self.heartbeat, self.disable = console, every, heartbeat, disable
        self.task: dict[str, Any] = {}
        self._printed = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __enter__(self) -> LineProgress:
        if not self.disable:
            threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def add_task(
        self, description: str, total: float | None = None, completed: float = 0, **fields: Any
    ) -> int:
        """The task (one only); ``description`` labels every line, later descriptions are its status."""
        self.task = {"label": description, "status": "", "total": total, "completed": completed}
        self.task |= {"start": completed, "since": time.monotonic()}
        return 0

    def update(
        self,
        task_id: int,
        *,
        advance: float = 0,
        completed: float | None = None,
        total: float | None = None,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        task = self.task
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
            task["start"] = fields.get("resumed", task["start"])
        if description is not None:
            task["status"] = " ".join(description.split())
        task["completed"] += advance
        finished = task["total"] is not None and task["completed"] >= task["total"]
        if advance and (finished or time.monotonic() - self._printed >= self.every):
            self._print()

    def line(self) -> str:
        """``label done/total (share) | status | elapsed 0:01:05 | eta 0:02:10``."""
        task = self.task
        done, total = int(task["completed"]), task["total"]
        elapsed = time.monotonic() - task["since"]
        parts = [
            f"{task['label']} {done}/{int(total)} ({100 * done / total:.0f}%)"
            if total
            else f"{task['label']} {done}"
        ]
        if task["status"]:
            parts.append(task["status"])
        parts.append(f"elapsed {clock(elapsed)}")
        ran = done - task["start"]
        if total and ran > 0:
            parts.append(f"eta {clock(elapsed / ran * (total - done))}")
        return " | ".join(parts)

    def _print(self) -> None:
        if self.disable or not self.task:
            return
        with self._lock:
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
            self.console.file.flush()
            self._printed = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat, 5.0)):
            if self.task and time.monotonic() - self._printed >= self.heartbeat:
                self._print()


def clock(seconds: float) -> str:
    """``H:MM:SS``."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
