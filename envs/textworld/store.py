"""On-disk cache of compiled TextWorld games, filled by a pool of worker processes.

One :class:`GameStore` per cache folder per process (see :func:`game_store`), shared by
every ``TextWorldEnv`` instance and thread. Generation is CPU-bound Python, so it runs in
child processes (``worker.py``, started with ``PYTHONHASHSEED=0`` for determinism).

Jobs are served by priority: a game a session is waiting for (:meth:`GameStore.game_file`)
goes before every prefetch job, so it waits at most for the one game a worker is busy
with, never for the prefetch backlog. Several processes may share one cache folder:
each game is written to a temporary folder and renamed into place, so nobody sees a
half-written game, and a duplicate generation is simply discarded.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.contract.errors import EngineError
from agentgym.envs.textworld.worker import GAME_FILE

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
ON_DEMAND, PREFETCH = 0, 1
IDLE_EXIT_S = 120.0
"""A worker process idle this long exits (it holds ~100 MB); the next job starts one."""
STALE_TMP_S = 3600.0
"""Temporary game folders older than this are leftovers of killed processes."""


@dataclass(frozen=True)
class GameSpec:
    """What to generate: ``key`` (the task id) names the game's folder in the cache."""

    key: str
    challenge: str
    settings: dict[str, Any]
    seed: int


@dataclass
class _Job:
    spec: GameSpec
    priority: int
    future: Future = field(default_factory=Future)
    started: bool = False


class _WorkerProcess:
    """One child running ``worker.py``; used by a single dispatcher thread at a time."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def generate(self, spec: GameSpec, dest: Path, tmp_root: Path) -> float:
        job = {
            "challenge": spec.challenge,
            "settings": spec.settings,
            "seed": spec.seed,
            "dest": str(dest),
            "tmp_root": str(tmp_root),
        }
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise EngineError(f"TextWorld worker exited (code {self.proc.wait()})")
        reply = json.loads(line)
        if not reply["ok"]:
            raise EngineError(f"generating {spec.key} failed: {reply['error']}")
        return float(reply["seconds"])

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class GameStore:
    """Compiled games under ``root``, generated on first use by up to ``workers`` children."""

    def __init__(self, root: Path, workers: int = 1) -> None:
        self.root = root
        self.tmp_root = root / ".tmp"
        self.workers = max(1, workers)
        self.generated = 0
        """Games this store generated (not found in the cache); tests and logs read it."""
        self.generation_seconds: list[float] = []
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, _Job]] = []
        self._jobs: dict[str, _Job] = {}
        self._seq = itertools.count()
        self._dispatchers = 0
        self._busy = 0
        self._closed = False
        self._procs: set[_WorkerProcess] = set()
        self._remove_stale_tmp()

    def path(self, key: str) -> Path:
        return self.root / key / GAME_FILE

    def cached(self, key: str) -> bool:
        return self.path(key).is_file()

    def game_file(self, spec: GameSpec) -> Path:
        """The compiled game of ``spec``, generating it first (ahead of any prefetch)."""
        path = self.path(spec.key)
        if path.is_file():
            return path
        self._submit(spec, ON_DEMAND).result()
        return path

    def prefetch(self, specs: Iterable[GameSpec]) -> None:
        """Queue ``specs`` that are not cached yet, in order, behind on-demand jobs."""
        for spec in specs:
            if not self.cached(spec.key):
                self._submit(spec, PREFETCH)

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._jobs)

    def shutdown(self) -> None:
        """Stop the workers; jobs still queued fail with EngineError. Idempotent."""
        with self._cond:
            self._closed = True
            jobs, self._jobs, self._heap = list(self._jobs.values()), {}, []
            procs = [worker.proc for worker in self._procs]
            self._cond.notify_all()
        for job in jobs:
            if not job.started:
                job.future.set_exception(EngineError("the TextWorld game store was shut down"))
        # Stop running generations too: on SIGTERM a worker removes its temporary folder
        # and exits; its dispatcher then sees EOF and forgets it.
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def _remove_stale_tmp(self) -> None:
        """Drop half-built games of processes that were killed (SIGKILL, OOM) mid-write;
        anything younger than an hour may belong to a live process sharing the cache."""
        cutoff = time.time() - STALE_TMP_S
        for folder in self.tmp_root.glob("gen-*"):
            with contextlib.suppress(OSError):
                if folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder, ignore_errors=True)

    # ----- scheduling ----------------------------------------------------------------

    def _submit(self, spec: GameSpec, priority: int) -> Future:
        with self._cond:
            if self._closed:
                raise EngineError("the TextWorld game store was shut down")
            job = self._jobs.get(spec.key)
            if job is None:
                job = self._jobs[spec.key] = _Job(spec, priority)
            elif job.started or priority >= job.priority:
                return job.future
            # A new heap entry; the job's old, lower-priority entry is skipped when popped.
            job.priority = priority
            heapq.heappush(self._heap, (priority, next(self._seq), job))
            self._maybe_add_dispatcher()
            self._cond.notify()
            return job.future

    def _maybe_add_dispatcher(self) -> None:
        idle = self._dispatchers - self._busy
        if idle < len(self._heap) and self._dispatchers < self.workers:
            self._dispatchers += 1
            threading.Thread(target=self._dispatch, name="textworld-gen", daemon=True).start()

    def _next_job(self) -> _Job | None:
        """Block for the next job; ``None`` after an idle period or at shutdown."""
        with self._cond:
            while not self._closed:
                while self._heap:
                    priority, _, job = heapq.heappop(self._heap)
                    if not job.started and priority == job.priority:
                        job.started = True
                        self._busy += 1
                        return job
                # Re-check the heap after a timeout: a job may have arrived just then.
                if not self._cond.wait(timeout=IDLE_EXIT_S) and not self._heap:
                    break
            self._dispatchers -= 1
            return None

    def _finish(self, job: _Job, seconds: float | None, error: Exception | None) -> None:
        with self._cond:
            self._busy -= 1
            self._jobs.pop(job.spec.key, None)
            if seconds is not None:
                self.generated += 1
                self.generation_seconds.append(seconds)
        if error is None:
            job.future.set_result(self.path(job.spec.key))
        else:
            job.future.set_exception(error)

    def _dispatch(self) -> None:
        worker: _WorkerProcess | None = None
        try:
            while (job := self._next_job()) is not None:
                try:
                    if self.cached(job.spec.key):  # another process generated it meanwhile
                        self._finish(job, None, None)
                        continue
                    worker = worker or self._start_worker()
                    seconds = worker.generate(job.spec, self.root / job.spec.key, self.tmp_root)
                except Exception as exc:
                    if worker is not None:
                        self._stop_worker(worker)  # its state is unknown after a failure
                        worker = None
                    if not isinstance(exc, EngineError):
                        exc = EngineError(f"generating {job.spec.key}: {type(exc).__name__}: {exc}")
                    self._finish(job, None, exc)
                else:
                    self._finish(job, seconds, None)
        finally:
            if worker is not None:
                self._stop_worker(worker)

    def _start_worker(self) -> _WorkerProcess:
        worker = _WorkerProcess()
        with self._cond:
            self._procs.add(worker)
        return worker

    def _stop_worker(self, worker: _WorkerProcess) -> None:
        with self._cond:
            self._procs.discard(worker)
        worker.close()


_stores: dict[Path, GameStore] = {}
_stores_lock = threading.Lock()


def game_store(root: Path, workers: int = 1) -> GameStore:
    """The process-wide store of ``root``; a later caller may raise its worker count."""
    root = root.expanduser().resolve()
    with _stores_lock:
        store = _stores.get(root)
        if store is None or store._closed:
            store = _stores[root] = GameStore(root, workers)
        store.workers = max(store.workers, workers)
        return store


@atexit.register
def _shutdown_all() -> None:
    with _stores_lock:
        stores = list(_stores.values())
    for store in stores:
        store.shutdown()
