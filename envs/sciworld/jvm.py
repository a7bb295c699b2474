"""ScienceWorld JVMs: one engine process per live episode, started ahead and reused.

ScienceWorld's simulator is a Scala program driven over py4j. Its own Python wrapper
starts a JVM per environment object, leaks a temporary folder and a callback server per
instance, and nothing caps the number of JVMs. Here a :class:`JvmPool` owns them:

* every JVM runs with a capped heap (``-Xmx``) and the serial collector (on a couple of
  cores a parallel collector's threads only compete with the other JVMs);
* ``spare`` idle JVMs are started ahead, so a reset takes a warm one instead of paying a
  JVM start (1-2 s alone, tens of seconds when many start at once on two cores); starts
  run at most ``start_concurrency`` at a time for the same reason, and a start that
  replaces a taken spare waits for a quiet moment (``top_up_quiet_s``) so that it does
  not compete with the resets of a burst of sessions;
* at most ``max_live`` JVMs exist (busy + idle + starting); one more acquire raises
  :class:`~agentgym.contract.errors.AtCapacity` (HTTP 429);
* a released JVM goes back to the idle list unless it died, hit ``recycle_after``
  episodes, or ``max_idle`` are idle already, in which case it is shut down, so memory
  stays bounded over long runs; an acquire takes the idle JVM that served the most
  episodes (its JIT-compiled code makes steps faster);
* every py4j call has a read timeout, so a hung engine surfaces as an error instead of
  blocking a server thread forever.

The JVM is started with ``--die-on-broken-pipe``: it exits when this process dies,
even on SIGKILL, so JVMs are never orphaned.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil
from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from scienceworld.constants import BASEPATH, JAR_PATH

from agentgym.contract.errors import AtCapacity, EngineError

log = logging.getLogger(__name__)

NON_HEAP_MB = 160
"""JVM memory beyond the heap (metaspace, code cache, threads), an upper estimate: measured
RSS was 350-365 MB with -Xmx256m and with -Xmx512m after 18 gold-path episodes, and
450 MB with -Xmx512m after loading all 30 task types with gold paths."""


def default_max_live(heap_mb: int) -> int:
    """JVMs that fit in half the memory available now, 2 to 64."""
    per_jvm = (heap_mb + NON_HEAP_MB) * 1024 * 1024
    return max(2, min(64, psutil.virtual_memory().available // 2 // per_jvm))


WARM_TASK = "find-plant"
"""The task a spare JVM plays first, with its gold path, before it is handed out (a short one)."""
WARM_LOADS = (
    "boil",
    "chemistry-mix",
    "grow-plant",
    "inclined-plane-determine-angle",
    "power-component",
    "use-thermometer",
)
"""Task types a spare JVM then loads once each (no gold path), so that the simulator's
common code is compiled before a session's first load: measured on this machine, 16
concurrent creates on JVMs warmed with one task cost 0.26 s of JVM CPU each, on 2 cores
~2 s at p99; loads get 2-3x cheaper after a few distinct task types (bench/RESULTS.md)."""


@dataclass(frozen=True)
class JvmSettings:
    """How JVMs are started and pooled (one pool per distinct settings per process)."""

    heap_mb: int = 512
    """``-Xmx`` of each JVM."""
    max_live: int | None = None
    """JVMs alive at most (busy, idle and starting); ``None``: :func:`default_max_live`."""
    spare: int = 1
    """Idle JVMs kept started ahead of demand."""
    max_idle: int = 4
    """Idle JVMs kept at most; more are shut down when released."""
    recycle_after: int = 200
    """Episodes after which a JVM is replaced (bounds any leak inside the engine)."""
    start_concurrency: int = 2
    """JVMs starting at once."""
    top_up_quiet_s: float = 2.0
    """A background start waits until no JVM was acquired for this long (10x it at most), so
    a burst of creates does not share the cores with the JVM starts it triggered (a start
    costs seconds of CPU), and is dropped if released JVMs refilled the pool meanwhile."""
    call_timeout_s: float = 15.0
    """Longest single engine call: what a hung JVM holds its caller before the session fails
    (was 45 s). Measured here (bench/RESULTS.md, ScienceWorld): a step's p99 is 26 ms alone
    and 0.7-1.2 s with 16 sessions at load 12-16; the longest call, a load that searches a
    gold path, took up to ~8 s (genetics tasks ~4 s): 15 s is about twice that. Below the
    servers' 60 s step deadline (``ServerConfig.step_deadline``), so a hung JVM fails only its
    own call and session; past the deadline the engine worker, with every session on it,
    would be killed unless :meth:`SciWorldEnv.abort` frees the call first."""

    start_timeout_s: float = 120.0
    """Longest wait for a new JVM's simulator to come up, and for a spare's warm-up episode:
    a start loads the engine's classes and data, 1-2 s alone but far beyond
    ``call_timeout_s`` when several JVMs start on two busy cores (CI saw a constructor
    time out at 15 s). Below the servers' 600 s reset deadline (a create may start one)."""

    def java_options(self) -> list[str]:
        return [f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC"]


class Jvm:
    """One ScienceWorld JVM and its py4j gateway. ``engine`` is the simulator object."""

    def __init__(self, settings: JvmSettings) -> None:
        port, self.process = launch_gateway(
            classpath=JAR_PATH,
            javaopts=settings.java_options(),
            die_on_exit=True,
            cwd=BASEPATH,
            return_proc=True,
        )
        parameters = GatewayParameters(port=port, auto_field=True, read_timeout=settings.start_timeout_s)
        self.gateway = JavaGateway(gateway_parameters=parameters, java_process=self.process)
        self.episodes = 0
        """Episodes loaded on this JVM (counted by the environment)."""
        try:
            self.engine: Any = self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        except Exception:
            self.close()  # never leave a half-started JVM behind
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def limit_calls(self, seconds: float) -> None:
        """Fail any later call that takes longer than ``seconds``: once started (and warmed),
        a call this slow is a hung engine. py4j sets a connection's timeout when it opens
        it, so the connections opened so far are closed."""
        self.gateway.gateway_parameters.read_timeout = seconds
        self.gateway._gateway_client.close()

    def warm(self) -> None:
        """Play a short episode so the first real one does not pay the simulator's class
        loading and first compilations (measured: a first load on a fresh JVM takes tens of
        seconds on a busy 2-core machine)."""
        self.engine.load(WARM_TASK, 0, "", True)
        self.engine.step("look around")
        for task in WARM_LOADS:
            self.engine.load(task, 0, "", False)
            self.engine.step("look around")

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Stop the JVM (kill it if it does not exit within 5 s). Idempotent."""
        with contextlib.suppress(Exception):
            self.gateway.close(keep_callback_server=False, close_callback_server_connections=True)
        # py4j's close leaves its client "connected": the finalizers of this JVM's objects
        # would later dial the dead port, log a traceback each and hold a socket until gc.
        self.gateway._gateway_client.is_connected = False
        if self.alive():
            # Closing stdin is the --die-on-broken-pipe signal; it exits within milliseconds.
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class JvmFailed(RuntimeError):
    """A JVM died or stopped answering mid-call. Deliberately not an AgentGymError: servers
    treat any other exception as a broken engine, close the session and answer 503."""


class JvmPool:
    """Hands out JVMs, one per episode-holding environment. Thread-safe. See the module doc."""

    def __init__(self, settings: JvmSettings) -> None:
        self.settings = settings
        self.max_live = settings.max_live or default_max_live(settings.heap_mb)
        self._lock = threading.Condition()  # notified when a spare JVM is started (or fails to)
        self._idle: list[Jvm] = []
        self._busy: set[Jvm] = set()
        self._starting = 0
        self._start_slots = threading.BoundedSemaphore(max(1, settings.start_concurrency))
        self._closed = False
        self.spare, self.max_idle = settings.spare, settings.max_idle
        """Idle JVMs kept started ahead, and kept at most (:meth:`keep_warm` raises both)."""
        self.started = 0
        """JVMs started so far (for tests and metrics)."""
        self._last_acquire = float("-inf")
        self._waiting = 0
        """Acquirers waiting for a spare to finish starting (at ``max_live``)."""

    @property
    def live(self) -> int:
        return len(self._idle) + len(self._busy) + self._starting

    def pids(self) -> list[int]:
        """Process ids of the JVMs alive now (busy and idle)."""
        with self._lock:
            return [jvm.pid for jvm in [*self._idle, *self._busy]]

    def acquire(self) -> Jvm:
        """A warm idle JVM, else a new one (started now); AtCapacity at ``max_live``. At the
        limit while spares are still starting, it waits for one instead of failing (spares
        count towards ``max_live`` but no acquirer can take them before they are up)."""
        with self._lock:
            jvm = self._take_idle()
            if jvm is None and self._starting:
                self._waiting += 1
                self._lock.notify_all()  # a spare start waiting for quiet goes ahead now
                self._lock.wait_for(
                    lambda: self._idle or self.live < self.max_live or not self._starting or self._closed,
                    self.settings.call_timeout_s,
                )
                self._waiting -= 1
                jvm = self._take_idle()
            if jvm is None:
                self._reserve_start()
            else:
                self._busy.add(jvm)
            self._last_acquire = time.monotonic()
        if jvm is None:
            jvm = self._start()
            with self._lock:
                self._starting -= 1
                self._busy.add(jvm)
        self.top_up()
        return jvm

    def release(self, jvm: Jvm) -> None:
        """Return ``jvm`` after its last episode; dead, worn or surplus JVMs are shut down."""
        with self._lock:
            self._busy.discard(jvm)
            keep = (
                not self._closed
                and jvm.alive()
                and jvm.episodes < self.settings.recycle_after
                and len(self._idle) < self.max_idle
            )
            if keep:
                self._idle.append(jvm)
                self._lock.notify_all()
                return
        self._retire(jvm)

    def discard(self, jvm: Jvm) -> None:
        """Kill a JVM that failed or hung mid-call and forget it (a spare replaces it)."""
        with self._lock:
            self._busy.discard(jvm)
        jvm.process.kill()
        self._retire(jvm)

    def top_up(self) -> None:
        """Start JVMs in the background until ``spare`` are idle or starting (within ``max_live``)."""
        with self._lock:
            wanted = self.spare - len(self._idle) - self._starting
            wanted = min(wanted, self.max_live - self.live)
            if self._closed or wanted <= 0:
                return
            self._starting += wanted
        for _ in range(wanted):
            threading.Thread(target=self._start_spare, name="sciworld-jvm-start", daemon=True).start()

    def keep_warm(self, count: int, wait_s: float = 0.0) -> None:
        """Keep ``count`` idle JVMs started ahead (and keep at least that many when released);
        wait up to ``wait_s`` seconds for the first ones to be up."""
        self.spare, self.max_idle = count, max(self.max_idle, count)
        self.top_up()
        with self._lock:
            self._lock.wait_for(lambda: len(self._idle) >= count or not self._starting, wait_s)

    def shutdown(self) -> None:
        """Stop every idle JVM now and every busy one when released. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._lock.notify_all()  # spare starts waiting for quiet give up now
        for jvm in idle:
            jvm.close()

    # ----- internals -------------------------------------------------------------------

    def _retire(self, jvm: Jvm) -> None:
        jvm.close()
        self.top_up()

    def _take_idle(self) -> Jvm | None:
        """The idle JVM that served the most episodes: its JIT has compiled the engine's
        hot paths (steps on a fresh JVM are several times slower for its first minutes)."""
        while self._idle:
            jvm = max(self._idle, key=lambda candidate: candidate.episodes)
            self._idle.remove(jvm)
            if jvm.alive():
                return jvm
            threading.Thread(target=jvm.close, daemon=True).start()  # died while idle
        return None

    def _reserve_start(self) -> None:
        if self._closed:
            raise EngineError("the ScienceWorld JVM pool was shut down")
        if self.live >= self.max_live:
            raise AtCapacity(
                f"all {self.max_live} ScienceWorld JVMs are in use; close a session or retry later",
                retry_after=5.0,
            )
        self._starting += 1

    def _start(self, *, warm: bool = False) -> Jvm:
        """Start one JVM for a reserved start (``warm``: and play its warm-up episode); the
        caller moves it out of ``_starting`` (in one locked step, so ``live`` never dips and
        lets another start overshoot). A failed start drops the reservation."""
        jvm = None
        try:
            with self._start_slots:
                jvm = Jvm(self.settings)
            with self._lock:
                self.started += 1
            if warm:
                jvm.warm()
        except Exception as exc:
            log.exception("starting a ScienceWorld JVM failed")
            if jvm is not None:
                jvm.close()
            with self._lock:
                self._starting -= 1
            raise EngineError(f"could not start a ScienceWorld JVM: {exc}") from exc
        jvm.limit_calls(self.settings.call_timeout_s)
        return jvm

    def _start_spare(self) -> None:
        with self._lock:
            self._wait_for_quiet()
            if self._closed or len(self._idle) >= self.spare:
                self._starting -= 1
                self._lock.notify_all()
                return
        try:
            jvm = self._start(warm=True)
        except EngineError:
            with self._lock:
                self._lock.notify_all()
            return  # logged in _start; the next acquire starts its own
        with self._lock:
            self._starting -= 1
            self._lock.notify_all()
            if not self._closed:
                self._idle.append(jvm)
                return
        jvm.close()

    def _wait_for_quiet(self) -> None:
        """With the lock held: wait until no JVM was acquired for ``top_up_quiet_s`` (10x it
        at most), or an acquirer waits for a spare, or the pool closes."""
        quiet = self.settings.top_up_quiet_s
        deadline = time.monotonic() + 10 * quiet
        while not self._closed and not self._waiting:
            remaining = min(self._last_acquire + quiet, deadline) - time.monotonic()
            if remaining <= 0:
                return
            self._lock.wait(remaining)  # woken early by any notify; the loop re-checks


_pools: dict[JvmSettings, JvmPool] = {}
_pools_lock = threading.Lock()


def jvm_pool(settings: JvmSettings) -> JvmPool:
    """The process-wide pool for ``settings`` (created on first use)."""
    with _pools_lock:
        pool = _pools.get(settings)
        if pool is None or pool._closed:
            pool = _pools[settings] = JvmPool(settings)
        return pool


@atexit.register
def shutdown_pools() -> None:
    """Shut down every pool of this process (at exit, or when a test module is done)."""
    with _pools_lock:
        pools = list(_pools.values())
    for pool in pools:
        pool.shutdown()


def rss_with_children(pid: int | None = None) -> int:
    """Resident memory of a process and all its descendants (e.g. a server and its JVMs), bytes."""
    process = psutil.Process(pid or os.getpid())
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total
