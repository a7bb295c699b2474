"""A lazy, append-only index of the trajectory JSONL files under a run folder (or one file).

Each line is parsed once to keep a small summary (env, task, outcome, reward, step) plus
its byte offset; full records are read back with one ``seek`` when an episode is opened,
so a 10,000-episode file costs one scan and pages are filtered in memory. Files may grow
while a run is going: :meth:`EpisodeIndex.refresh` reads only the bytes appended since the
last scan (whole lines only: a line still being written is picked up next time).
Episode ids are positions in the index; it only ever grows, so ids stay valid.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentgym.trajectory import is_trajectory_record, jsonl_files, sniff_trajectory_file, step_of

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
REFRESH_EVERY_S = 1.0
"""Rescans are cheap (stat calls) but pages are requested often; once a second is live enough."""


class NotTrajectoryFile(ValueError):
    """The path holds no trajectory records (missing, empty, or another kind of JSONL)."""


@dataclass
class Summary:
    """What the episode list shows and filters on; ``reward`` is the sum of per-turn rewards."""

    id: int
    source: str
    """The file, relative to the viewed folder."""
    step: int | None
    env: str
    task_id: str
    sample: int
    split: str | None
    policy: str
    success: bool
    score: float
    reward: float
    turns: int
    end_reason: str
    tokens: bool
    """The record carries token ids (a token-level policy played it)."""
    ordinal: int = 0
    """Position among the episodes of ``source`` (0-based): with ``source``, a name for the
    episode that survives a restart of the viewer (the page's ``#source/ordinal`` links)."""


@dataclass
class _Location:
    file: Path
    offset: int
    length: int


def summarize(index: int, source: str, step: int | None, record: dict[str, Any], ordinal: int = 0) -> Summary:
    return Summary(
        id=index,
        source=source,
        step=step,
        env=str(record.get("env", "")),
        task_id=str(record["task_id"]),
        sample=int(record.get("sample", 0)),
        split=record.get("split"),
        policy=str(record.get("policy", "")),
        success=bool(record.get("success", False)),
        score=float(record.get("score", 0.0)),
        reward=float(sum(record.get("rewards") or [])),
        turns=int(record.get("turns", 0)),
        end_reason=str(record.get("end_reason", "")),
        tokens=bool(record.get("token_ids")),
        ordinal=ordinal,
    )


class EpisodeIndex:
    """Episodes of ``root``: a trajectory JSONL file, or every trajectory JSONL under a run
    folder (``rollouts/step-N.jsonl``, eval ``trajectories.jsonl``, ...; ``metrics.jsonl``
    and other JSONL files are left out). Thread-safe; see the module docstring."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.exists():
            raise NotTrajectoryFile(f"{self.root} does not exist")
        if self.root.is_file() and not sniff_trajectory_file(self.root):
            raise NotTrajectoryFile(f"{self.root} is not a trajectory JSONL file")
        self.summaries: list[Summary] = []
        self.skipped_lines = 0
        self._locations: list[_Location] = []
        self._scanned: dict[Path, int] = {}  # bytes consumed so far, per file
        self._rejected: set[Path] = set()  # JSONL files that are not trajectories
        self._per_source: dict[str, int] = {}  # episodes indexed so far, per file
        self._lock = threading.Lock()
        self._last_refresh = 0.0
        self.refresh(force=True)

    @property
    def metrics_path(self) -> Path | None:
        return self.root / METRICS_FILE if self.root.is_dir() else None

    def files(self) -> list[Path]:
        """Trajectory files to index, in a stable order (steps in numeric order first)."""
        return jsonl_files(self.root)

    def refresh(self, force: bool = False) -> None:
        """Index new files and lines appended to known ones (at most once per second unless forced)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_refresh < REFRESH_EVERY_S:
                return
            self._last_refresh = now
            for path in self.files():
                if path in self._rejected:
                    continue
                if path not in self._scanned and not sniff_trajectory_file(path):
                    # Empty files may still become trajectory files; only reject real content.
                    if path.stat().st_size > 0:
                        self._rejected.add(path)
                    continue
                self._scan(path)

    def _scan(self, path: Path) -> None:
        start = self._scanned.get(path, 0)
        if path.stat().st_size <= start:
            return
        source = str(path.relative_to(self.root)) if self.root.is_dir() else path.name
        step = step_of(path)
        with open(path, "rb") as handle:
            handle.seek(start)
            offset = start
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # being written (or torn by a crash): read it once it is complete
                self._add_line(path, source, step, offset, line)
                offset += len(line)
        self._scanned[path] = offset

    def _add_line(self, path: Path, source: str, step: int | None, offset: int, line: bytes) -> None:
        if not line.strip():
            return
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not is_trajectory_record(record):
            self.skipped_lines += 1
            log.warning("%s: skipping a line at byte %d that is not a trajectory record", path, offset)
            return
        try:
            ordinal = self._per_source.get(source, 0)
            summary = summarize(len(self.summaries), source, step, record, ordinal)
        except (TypeError, ValueError, OverflowError) as exc:
            # A field of the wrong type ("sample": "x"): skip the line. Raising here would
            # leave the scan offset before it, so every later refresh would fail on it again.
            self.skipped_lines += 1
            log.warning("%s: skipping a record at byte %d with a malformed field: %s", path, offset, exc)
            return
        self._per_source[source] = ordinal + 1
        self.summaries.append(summary)
        self._locations.append(_Location(path, offset, len(line)))

    def record(self, episode_id: int) -> dict[str, Any]:
        """The full record of an episode; ``KeyError`` for an unknown id."""
        if not 0 <= episode_id < len(self._locations):
            raise KeyError(episode_id)
        where = self._locations[episode_id]
        with open(where.file, "rb") as handle:
            handle.seek(where.offset)
            return json.loads(handle.read(where.length))

    def facets(self) -> dict[str, Any]:
        """Distinct values for the filter menus, and counts."""
        summaries = list(self.summaries)
        return {
            "episodes": len(summaries),
            "envs": sorted({s.env for s in summaries}),
            "steps": sorted({s.step for s in summaries if s.step is not None}),
            "sources": list(dict.fromkeys(s.source for s in summaries)),
            "skipped_lines": self.skipped_lines,
        }


@dataclass(frozen=True)
class EpisodeFilter:
    """Server-side filters of the episode list; ``None`` means no constraint. ``task`` matches
    a substring of the task id; the reward bounds are inclusive."""

    env: str | None = None
    task: str | None = None
    success: bool | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    step: int | None = None
    source: str | None = None

    def matches(self, s: Summary) -> bool:
        return (
            (self.env is None or s.env == self.env)
            and (self.task is None or self.task in s.task_id)
            and (self.success is None or s.success == self.success)
            and (self.min_reward is None or s.reward >= self.min_reward)
            and (self.max_reward is None or s.reward <= self.max_reward)
            and (self.step is None or s.step == self.step)
            and (self.source is None or s.source == self.source)
        )


def page(index: EpisodeIndex, where: EpisodeFilter, offset: int, limit: int) -> dict[str, Any]:
    """``{"total", "offset", "limit", "episodes"}``: the ``limit`` matches from ``offset`` on."""
    matches = [s for s in list(index.summaries) if where.matches(s)]
    return {
        "total": len(matches),
        "offset": offset,
        "limit": limit,
        "episodes": [asdict(s) for s in matches[offset : offset + limit]],
    }


def read_metrics(path: Path | None, since: int = 0) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl`` from row ``since`` on; a line still being written is left out."""
    if path is None or not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines()[since:]:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break  # a torn last line: the trainer is writing it now
    return rows
