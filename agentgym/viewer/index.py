"""A lazy index of the trajectory JSONL files under a run folder (or one file).

Each line is parsed once to keep a small summary (env, task, outcome, reward, step) plus
its byte offset; full records are read back with one ``seek`` when an episode is opened,
so a 10,000-episode file costs one scan and pages are filtered in memory. Files may grow
while a run is going: :meth:`EpisodeIndex.refresh` reads only the bytes appended since the
last scan (whole lines only: a line still being written is picked up next time).

A line that is not a trajectory record, or whose fields have shapes the episode view
cannot show (:func:`~agentgym.viewer.episode.check_record`), is skipped and counted. A
file rewritten under the viewer (truncated, replaced, or changed in place) is read again
from its start: its old episodes are gone (their ids answer 404), its new ones get new
ids. Ids are never reused, so an id never names another episode.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentgym.records.trajectory import is_trajectory_record, jsonl_files, sniff_trajectory_file, step_of
from agentgym.viewer.episode import check_record

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
REFRESH_EVERY_S = 1.0
"""Rescans are cheap (stat calls) but pages are requested often; once a second is live enough."""


class NotTrajectoryFile(ValueError):
    """The path holds no trajectory records (missing, empty, or another kind of JSONL)."""


@dataclass
class EpisodeSummary:
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
    crc: int
    """CRC-32 of the line's bytes: a line read back with another one was rewritten."""


@dataclass
class _FileState:
    """What the index has read of one file, to tell appended bytes from a rewrite."""

    stat: tuple[int, int, int]
    """(inode, size, mtime) when last scanned: unchanged means nothing to read."""
    consumed: int = 0
    """Bytes read so far (whole lines)."""
    last_line: _Location | None = None
    """The last line read: an append leaves it as it was, a rewrite does not."""
    skipped: int = 0
    episodes: list[int] = field(default_factory=list)


def summarize(
    index: int, source: str, step: int | None, record: dict[str, Any], ordinal: int = 0
) -> EpisodeSummary:
    return EpisodeSummary(
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
        self._episodes: dict[int, tuple[EpisodeSummary, _Location]] = {}
        self._next_id = 0
        self._files: dict[Path, _FileState] = {}
        self._rejected: set[Path] = set()  # JSONL files that are not trajectories
        self._lock = threading.Lock()
        self._last_refresh = 0.0
        self.refresh(force=True)

    @property
    def metrics_path(self) -> Path | None:
        return self.root / METRICS_FILE if self.root.is_dir() else None

    @property
    def summaries(self) -> list[EpisodeSummary]:
        """Every episode indexed, in file order."""
        with self._lock:
            return [summary for summary, _ in self._episodes.values()]

    @property
    def skipped_lines(self) -> int:
        """Lines of the current files that are not episodes the viewer can show."""
        with self._lock:
            return sum(state.skipped for state in self._files.values())

    def files(self) -> list[Path]:
        """Trajectory files to index, in a stable order (steps in numeric order first)."""
        return jsonl_files(self.root)

    def refresh(self, force: bool = False) -> None:
        """Index new files and lines appended to known ones, read rewritten files again and
        forget removed ones (at most once per second unless forced)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_refresh < REFRESH_EVERY_S:
                return
            self._last_refresh = now
            present = self.files()
            for gone in self._files.keys() - set(present):
                self._forget(gone)
            for path in present:
                if path in self._rejected:
                    continue
                try:
                    self._refresh_file(path)
                except OSError as exc:  # removed or unreadable since it was listed
                    log.warning("%s: not read: %s", path, exc)
                    self._forget(path)

    def _refresh_file(self, path: Path) -> None:
        info = os.stat(path)
        stat = (info.st_ino, info.st_size, info.st_mtime_ns)
        state = self._files.get(path)
        if state is not None and state.stat == stat:
            return
        if state is not None and (stat[0] != state.stat[0] or not _unchanged(state.last_line, info.st_size)):
            log.info("%s was rewritten: reading it again", path)
            self._forget(path)
            state = None
        if state is None:
            if not sniff_trajectory_file(path):
                # Empty files may still become trajectory files; only reject real content.
                if info.st_size > 0:
                    self._rejected.add(path)
                return
            state = self._files[path] = _FileState(stat)
        self._scan(path, state)
        state.stat = stat

    def _forget(self, path: Path) -> None:
        """Drop a file's episodes and what was read of it (it is read again if it is still there)."""
        state = self._files.pop(path, None)
        if state is not None:
            for episode_id in state.episodes:
                del self._episodes[episode_id]

    def _scan(self, path: Path, state: _FileState) -> None:
        source = str(path.relative_to(self.root)) if self.root.is_dir() else path.name
        step = step_of(path)
        with open(path, "rb") as handle:
            handle.seek(state.consumed)
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # being written (or torn by a crash): read it once it is complete
                where = _Location(path, state.consumed, len(line), zlib.crc32(line))
                self._add_line(state, source, step, where, line)
                state.consumed += len(line)
                state.last_line = where

    def _add_line(
        self, state: _FileState, source: str, step: int | None, where: _Location, line: bytes
    ) -> None:
        if not line.strip():
            return
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not is_trajectory_record(record):
            state.skipped += 1
            log.warning(
                "%s: skipping a line at byte %d that is not a trajectory record", where.file, where.offset
            )
            return
        try:
            check_record(record)
            summary = summarize(self._next_id, source, step, record, len(state.episodes))
        except (TypeError, ValueError, OverflowError) as exc:
            # A field of the wrong type ("sample": "x", messages not a list): skip the line.
            # Raising here would leave the scan offset before it, so every later refresh
            # would fail on it again.
            state.skipped += 1
            log.warning(
                "%s: skipping a record at byte %d with a malformed field: %s", where.file, where.offset, exc
            )
            return
        self._episodes[self._next_id] = (summary, where)
        state.episodes.append(self._next_id)
        self._next_id += 1

    def episode(self, episode_id: int) -> tuple[EpisodeSummary, dict[str, Any]]:
        """An episode's summary and full record; ``KeyError`` for an id unknown or gone
        (its file was rewritten or removed since it was indexed)."""
        with self._lock:
            summary, where = self._episodes[episode_id]
        try:
            with open(where.file, "rb") as handle:
                handle.seek(where.offset)
                line = handle.read(where.length)
        except OSError:
            line = b""
        if zlib.crc32(line) != where.crc:  # rewritten since it was read: read it again now
            with self._lock:
                self._forget(where.file)
            self.refresh(force=True)
            raise KeyError(episode_id)
        return summary, json.loads(line)

    def facets(self) -> dict[str, Any]:
        """Distinct values for the filter menus, and counts."""
        summaries = self.summaries
        return {
            "episodes": len(summaries),
            "next_id": self._next_id,  # moves with every episode added, also by a rewrite
            "envs": sorted({s.env for s in summaries}),
            "steps": sorted({s.step for s in summaries if s.step is not None}),
            "sources": list(dict.fromkeys(s.source for s in summaries)),
            "skipped_lines": self.skipped_lines,
        }


def _unchanged(line: _Location | None, size: int) -> bool:
    """Whether the last line read is still in its file as it was (so the file only grew)."""
    if line is None:
        return True
    if size < line.offset + line.length:
        return False
    with open(line.file, "rb") as handle:
        handle.seek(line.offset)
        return zlib.crc32(handle.read(line.length)) == line.crc


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

    def matches(self, s: EpisodeSummary) -> bool:
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
    matches = [s for s in index.summaries if where.matches(s)]
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
