"""Gold paths without the simulator's path search at reset.

``load(..., generateGoldPath=True)`` makes ScienceWorld search for a task's gold path: 0.1 s
for most task types, ~4 s for the genetics ones (measured on this project's 2-core
machine), against ~0.03 s for the load alone. A path is a property of the task, the
variation and the simplifications, so it is computed once and kept. (Not to the letter:
the simulator is not fully deterministic, so two searches of one task can return
different paths, and 36 of the 7,207 searched paths lost when replayed right away. Of 400
shipped paths replayed on another JVM, 399 won.)

* ``gold_paths.json.gz`` ships every variation's path for the default simplifications
  (``""``), built with this module's command line (``python -m
  agentgym.envs.sciworld.gold``), which replays each path on a load *without* the search
  and keeps only the paths that win there;
* a path searched at run time (another simplification string, or a table built for a
  different ScienceWorld version) is kept in memory, so the other episodes of an RL group
  on the same task reuse it, and on disk (``cache_dir("sciworld-gold")``), so a server's
  other engine workers (processes) reuse it too: one search per task and simplifications
  per machine, the searches of one path serialised by a file lock.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import importlib.metadata
import json
import logging
import multiprocessing
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.progress import Progress

from agentgym.contract.cache import cache_dir
from agentgym.envs.sciworld.jvm import Jvm, JvmSettings
from agentgym.envs.sciworld.tasks import TASK_TYPES

log = logging.getLogger(__name__)

TABLE = Path(__file__).with_name("gold_paths.json.gz")
"""The shipped table: ``{"scienceworld": version, "simplifications": "", "paths": {task_id:
"action\\naction..."}}``, each path one newline-joined string (actions have no newlines):
parsed, a tenth of the memory of lists of strings."""

MEMORY_PATHS = 4096
"""Searched paths kept in memory per process (a path is ~1 KB)."""


def engine_version() -> str:
    return importlib.metadata.version("scienceworld")


class GoldPaths:
    """Gold action sequences by (task id, simplifications): the shipped table, then the
    paths searched in this process (least recently used dropped past ``MEMORY_PATHS``)."""

    def __init__(self, table: Path = TABLE) -> None:
        self._table_path = table
        # Paths are held joined, as in the table.
        self._table: dict[str, str] | None = None
        self._table_simplifications = ""
        self._searched: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, task_id: str, simplifications: str) -> list[str] | None:
        """The known gold path of ``task_id`` under ``simplifications``, or ``None``."""
        with self._lock:
            table = self._load_table()
            if simplifications == self._table_simplifications and task_id in table:
                return _split(table[task_id])
            joined = self._searched.get((task_id, simplifications))
            if joined is not None:
                self._searched.move_to_end((task_id, simplifications))
                return _split(joined)
        shared = self._shared(task_id, simplifications)  # another process searched it
        if shared is None:
            return None
        self._remember(task_id, simplifications, shared)
        return _split(shared)

    @property
    def searched(self) -> int:
        """How many searched paths are kept (0 while every reset found its path in the table)."""
        return len(self._searched)

    def put(self, task_id: str, simplifications: str, path: list[str]) -> None:
        """Keep a path the engine searched at run time, here and for the other processes."""
        joined = "\n".join(path)
        self._remember(task_id, simplifications, joined)
        target = self._shared_file(task_id, simplifications)
        with contextlib.suppress(OSError):  # a store that cannot be written is only a cache
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            staging.write_text(joined)
            os.replace(staging, target)

    @contextlib.contextmanager
    def searching(self, task_id: str, simplifications: str) -> Iterator[list[str] | None]:
        """Held around a path search: yields the path another process found meanwhile (or
        None: search, then :meth:`put`). One process searches a path at a time; the others
        wait for it instead of searching too."""
        lock_file = self._shared_file(task_id, simplifications).with_suffix(".lock")
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_file, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield self.get(task_id, simplifications)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _remember(self, task_id: str, simplifications: str, joined: str) -> None:
        with self._lock:
            self._searched[(task_id, simplifications)] = joined
            while len(self._searched) > MEMORY_PATHS:
                self._searched.popitem(last=False)

    def _shared_file(self, task_id: str, simplifications: str) -> Path:
        folder = cache_dir("sciworld-gold") / engine_version()
        key = hashlib.sha256(f"{task_id}\n{simplifications}".encode()).hexdigest()[:32]
        return folder / f"{key}.txt"

    def _shared(self, task_id: str, simplifications: str) -> str | None:
        try:
            return self._shared_file(task_id, simplifications).read_text()
        except OSError:
            return None

    def _load_table(self) -> dict[str, str]:
        if self._table is None:
            self._table = {}
            if self._table_path.exists():
                with gzip.open(self._table_path, "rt") as file:
                    shipped = json.load(file)
                if shipped["scienceworld"] == engine_version():
                    self._table = shipped["paths"]
                    self._table_simplifications = shipped["simplifications"]
                else:
                    log.warning(
                        "%s was built for scienceworld %s, not %s: gold paths are searched at reset",
                        self._table_path.name,
                        shipped["scienceworld"],
                        engine_version(),
                    )
        return self._table


def _split(joined: str) -> list[str]:
    return joined.split("\n") if joined else []


GOLD_PATHS = GoldPaths()
"""The process's gold paths, shared by every :class:`SciWorldEnv`."""


# ----- building the table -------------------------------------------------------------

_jvm: Jvm | None = None


def _start_jvm() -> None:
    global _jvm
    _jvm = Jvm(JvmSettings())


def _verified_gold_path(task_id: str) -> tuple[str, list[str] | None]:
    """The engine's gold path for ``task_id``, or ``None`` when replaying it on a load
    without the search does not win (then resets keep searching for that task)."""
    name, variation = task_id.rsplit("/", 1)
    engine = _jvm.engine
    engine.load(name, int(variation), "", True)
    path = list(engine.getGoldActionSequence())
    engine.load(name, int(variation), "", False)
    for action in path:
        engine.step(action)
    won = engine.getScore() >= 1.0 and bool(engine.getCompleted())
    return task_id, path if won else None


def _all_task_ids() -> Iterator[str]:
    # The expensive genetics types last, so a partial build covers the most task types.
    for task_type in sorted(TASK_TYPES, key=lambda t: t.num.startswith("10-")):
        for variation in range(task_type.variations):
            yield f"{task_type.name}/{variation}"


def build(out: Path, processes: int, task_ids: Sequence[str] | None = None) -> None:
    """Search and verify the gold path of every variation (or of ``task_ids``) with
    ``processes`` JVMs and write the table to ``out``. Resumable: finished tasks are
    appended to ``out``'s ``.partial`` file as they come and skipped by a re-run."""
    partial = out.with_suffix(".partial")
    done = _read_partial(partial)
    todo = [task_id for task_id in task_ids or _all_task_ids() if task_id not in done]
    with (
        multiprocessing.get_context("spawn").Pool(processes, initializer=_start_jvm) as pool,
        partial.open("a") as log_file,
        Progress() as progress,
    ):
        bar = progress.add_task("gold paths", total=len(done) + len(todo), completed=len(done))
        for task_id, path in pool.imap_unordered(_verified_gold_path, todo, chunksize=4):
            log_file.write(json.dumps([task_id, path]) + "\n")
            log_file.flush()
            done[task_id] = path
            progress.advance(bar)
    paths = {task_id: "\n".join(path) for task_id, path in sorted(done.items()) if path is not None}
    failed = [task_id for task_id, path in done.items() if path is None]
    table = {"scienceworld": engine_version(), "simplifications": "", "paths": paths}
    with gzip.open(out, "wt", compresslevel=9) as file:
        json.dump(table, file, separators=(",", ":"))
    partial.unlink()
    print(f"{len(paths)} gold paths written to {out}; {len(failed)} did not win on replay: {failed[:20]}")


def _read_partial(partial: Path) -> dict[str, list[str] | None]:
    if not partial.exists():
        return {}
    lines = partial.read_text().splitlines()
    return dict(json.loads(line) for line in lines if line.endswith("]"))


def main() -> None:
    parser = argparse.ArgumentParser(description=build.__doc__)
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tasks", nargs="*", help="task ids (default: every variation of every task type)")
    args = parser.parse_args()
    build(args.out, args.processes, args.tasks)


if __name__ == "__main__":
    main()
