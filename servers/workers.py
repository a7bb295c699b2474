"""Engines in worker processes: a pool of :mod:`~agentgym.servers.engine_worker` children.

Envs whose engine is native or heavy (``TextEnv.engine_process``: textworld's jericho,
sciworld's JVM bridge) run their engines here instead of in threads of the server:

* a pool of worker processes, one per CPU core by default, started before the server takes
  its first request; each session's engine is built in the worker hosting the fewest
  engines and stays pinned to it;
* requests are multiplexed over one socket pair per worker (length-prefixed pickles,
  see :mod:`~agentgym.servers.engine_worker`) and read by the event loop without blocking,
  so it never runs engine code and never waits on a worker;
* a worker that dies (a segfault, ``kill -9``) fails only the sessions it hosted
  (:class:`WorkerDied`; servers answer 503 ``engine_failed``) and is replaced at once;
* a call past its deadline fails its session, and its engine is told to abort the call
  (``abort()``: sciworld kills its JVM); only if the call is still running
  :data:`ABORT_GRACE_S` later is the worker killed (the only way to stop a call stuck in C
  code, e.g. jericho's), failing its other sessions the same way; a replacement starts at once;
* shutdown closes the sockets (workers close their engines and exit) and kills any worker
  still alive after :data:`EXIT_GRACE_S`, so it finishes in bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentgym.contract.errors import EngineError
from agentgym.servers.engine_worker import HEADER, READY, WorkerInit, decode_error, encode_error, frame
from agentgym.servers.sessions import EngineTimeout

log = logging.getLogger(__name__)

EXIT_GRACE_S = 10.0
"""Seconds a worker gets to close its engines at shutdown before it is killed."""
START_TIMEOUT_S = 120.0
"""Seconds a worker may take to import its env and warm its engines."""
ABORT_GRACE_S = 5.0
"""Seconds a call past its deadline gets to return once its engine was told to abort,
before its worker (with every session on it) is killed."""


class WorkerDied(RuntimeError):
    """The worker process hosting an engine exited (crashed or was killed). Deliberately not
    an AgentGymError: the session manager treats it as a broken engine (503)."""


class RemoteEngine:
    """The server's handle on one engine in a worker: the state the session routes read
    (task, turn, done flag, last observation and info, compat fields, mirrored attributes)
    as of the engine's last reply, so reading it costs no round trip."""

    def __init__(self, engine_id: int, worker: WorkerProcess) -> None:
        self.engine_id, self.worker = engine_id, worker
        self.current_task: Any = None
        self.turn = 0
        self.done = True
        self.last_observation = ""
        self.last_info: dict[str, Any] = {}
        self._compat: dict[str, dict[str, Any]] = {}
        self._extras: dict[str, Any] = {}

    def apply(self, state: dict[str, Any]) -> None:
        self.current_task, self.turn, self.done = state["current_task"], state["turn"], state["done"]
        self.last_observation, self.last_info = state["last_observation"], state["last_info"]
        self._compat, self._extras = state.get("compat", {}), state["extras"]

    def compat_fields(self, route: str) -> dict[str, Any]:
        return self._compat.get(route, {})

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not set above: the env's ``mirrored_attributes``.
        extras = self.__dict__.get("_extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(name)

    def close(self) -> None:
        """Close the engine in its worker without waiting; safe from any thread."""
        self.worker.close_engine(self)


class WorkerProcess:
    """One worker process and the requests in flight to it (event-loop side)."""

    def __init__(
        self,
        index: int,
        init: WorkerInit,
        on_exit: Callable[[WorkerProcess, str], None],
        catalog: CatalogService,
    ) -> None:
        self.index, self._init, self._on_exit, self._catalog = index, init, on_exit, catalog
        self.engines: set[RemoteEngine] = set()
        self.ready = asyncio.Event()
        self.alive = True
        self._pending: dict[int, asyncio.Future] = {}
        self._request_ids = itertools.count()
        self._loop = asyncio.get_running_loop()
        self._writer: asyncio.StreamWriter | None = None
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentgym.servers.engine_worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._socket = ours
        self._reader_task = asyncio.create_task(self._run(ours), name=f"engine-worker-{index}")

    @property
    def pid(self) -> int:
        return self.process.pid

    async def request(
        self,
        op: str,
        engine: RemoteEngine,
        name: str = "",
        args: tuple = (),
        kwargs: dict | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Send one request and wait for its reply (at most ``deadline`` seconds: past it the
        worker is killed, since a stuck call cannot be stopped otherwise)."""
        if not self.alive or self._writer is None:
            raise WorkerDied(f"engine worker {self.pid} is gone")
        request_id = next(self._request_ids)
        future = self._pending[request_id] = self._loop.create_future()
        self._writer.write(frame((request_id, op, engine.engine_id, name, args, kwargs or {})))
        try:
            # Shielded: past the deadline the reply still tells whether the abort freed the call.
            ok, value, state = await asyncio.wait_for(asyncio.shield(future), deadline)
        except TimeoutError:
            self.engines.discard(engine)  # failed by the caller, not as a bystander
            self._abort(engine, future, f"an engine call passed its {deadline:g}s deadline")
            raise EngineTimeout(f"the environment engine did not answer within {deadline:g}s") from None
        if not ok:
            raise decode_error(value)
        engine.apply(state)
        return value

    def close_engine(self, engine: RemoteEngine) -> None:
        """Fire-and-forget close (thread-safe): the engine is dropped from this worker at once."""

        def send() -> None:
            self.engines.discard(engine)
            if self.alive and self._writer is not None:
                self._writer.write(frame((None, "close", engine.engine_id, "", (), {})))

        if _running_loop() is self._loop:
            send()
        else:
            self._loop.call_soon_threadsafe(send)

    def _abort(self, engine: RemoteEngine, call: asyncio.Future, reason: str) -> None:
        """Have the worker abort ``engine``'s stuck call; kill the worker if the call has not
        returned :data:`ABORT_GRACE_S` later."""
        call.add_done_callback(lambda done: done.cancelled() or done.exception())  # nobody awaits it now
        if self.alive and self._writer is not None:
            self._writer.write(frame((None, "abort", engine.engine_id, "", (), {})))
        self._loop.call_later(
            ABORT_GRACE_S, lambda: call.done() or self.kill(f"{reason}; aborting it failed")
        )

    def _reply_catalog(self, call_id: int, ok: bool, value: Any) -> None:
        if self.alive and self._writer is not None:
            self._writer.write(frame(("catalog", call_id, ok, value)))

    def kill(self, reason: str) -> None:
        if self.process.poll() is None:
            log.error("killing engine worker %s: %s", self.pid, reason)
            self.process.kill()

    async def stop(self) -> None:
        """Close the socket (the worker closes its engines and exits); kill it after the grace."""
        if self._writer is not None:
            self._writer.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.process.wait), EXIT_GRACE_S)
        except TimeoutError:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task

    async def _run(self, sock: socket.socket) -> None:
        reader, self._writer = await asyncio.open_unix_connection(sock=sock)
        self._writer.write(frame(self._init))
        try:
            if await _read(reader) != READY:
                raise WorkerDied("engine worker answered its start-up with something else")
            self.ready.set()
            while True:
                message = await _read(reader)
                if message[0] == "catalog":
                    self._catalog.serve(message[1:], self._reply_catalog)
                    continue
                request_id, ok, value, state = message
                future = self._pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result((ok, value, state))
        except (asyncio.IncompleteReadError, ConnectionError, WorkerDied, pickle.UnpicklingError) as exc:
            self._died(exc)

    def _died(self, exc: BaseException) -> None:
        self.alive = False
        if self.process.poll() is None:  # it closed its socket or sent garbage but lives on
            self.process.kill()
        self._loop.run_in_executor(None, self.process.wait)  # reap it
        reason = f"its engine worker process (pid {self.pid}) died"
        if not isinstance(exc, asyncio.IncompleteReadError):
            reason += f" ({exc})"
        for future in self._pending.values():
            if not future.done():
                future.set_exception(WorkerDied(reason))
        self._on_exit(self, reason)
        self.ready.set()  # wake anyone waiting for it to start; they see ``alive`` False


class CatalogService:
    """Runs workers' ``on_catalog`` calls on the server's catalog instance, in threads of its
    own (a call may wait minutes for a game to be generated)."""

    def __init__(self, catalog: Any, threads: int) -> None:
        self.catalog = catalog
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="catalog")

    def serve(self, call: tuple, reply: Callable[[int, bool, Any], None]) -> None:
        call_id, method, args = call

        def answer(done: asyncio.Future) -> None:
            if not done.cancelled():  # cancelled at shutdown: the worker is going too
                reply(call_id, *done.result())

        asyncio.get_running_loop().run_in_executor(self._executor, self._run, method, args).add_done_callback(
            answer
        )

    def _run(self, method: str, args: tuple) -> tuple[bool, Any]:
        try:
            return True, getattr(self.catalog, method)(*args)
        except Exception as exc:
            return False, encode_error(exc)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class WorkerEngines:
    """Session engines hosted by a pool of worker processes (see the module docstring).

    ``on_lost(engines, reason)`` is called when a worker dies with the engines it took with it
    (the session manager fails their sessions)."""

    def __init__(
        self,
        factory: Callable[..., Any],
        config: dict[str, Any],
        *,
        catalog: Any,
        workers: int,
        threads: int,
        warm: int = 0,
    ) -> None:
        self.count = max(1, workers)
        self._init = WorkerInit(
            sys_path=list(sys.path),
            factory=_pickle_factory(factory),
            config=config,
            threads=max(1, threads),
            warm=warm,
        )
        self.workers: list[WorkerProcess] = []
        self._catalog = CatalogService(catalog, max(1, threads))
        self._engine_ids = itertools.count()
        self._closing = False
        self.on_lost: Callable[[list[RemoteEngine], str], None] = lambda engines, reason: None
        self.replaced = 0
        """Workers replaced after they died (for tests and metrics)."""
        self.stuck_calls = 0
        """Always 0: a stuck call's worker is killed (kept for the thread host's interface)."""

    async def start(self) -> None:
        """Start every worker and wait until all are ready (or fail the server's start)."""
        self.workers = [self._spawn(i) for i in range(self.count)]
        await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in self.workers)), START_TIMEOUT_S)
        dead = [w.pid for w in self.workers if not w.alive]
        if dead:
            raise EngineError(f"engine worker(s) {dead} exited at start-up; see the server log")

    async def build(self, deadline: float | None) -> RemoteEngine:
        worker = await self._least_loaded()
        engine = RemoteEngine(next(self._engine_ids), worker)
        worker.engines.add(engine)
        try:
            await worker.request("open", engine, deadline=deadline)
        except BaseException:
            worker.engines.discard(engine)
            raise
        return engine

    async def call(
        self, engine: RemoteEngine, name: str, args: tuple, kwargs: dict, deadline: float | None
    ) -> Any:
        return await engine.worker.request("call", engine, name, args, kwargs, deadline)

    def close(self, engine: RemoteEngine) -> None:
        engine.close()

    async def shutdown(self) -> None:
        self._closing = True
        await asyncio.gather(*(w.stop() for w in self.workers))
        self._catalog.shutdown()

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.alive]

    async def _least_loaded(self) -> WorkerProcess:
        ready = [w for w in self.workers if w.alive and w.ready.is_set()]
        if not ready:  # every worker is being replaced: wait for the first one back
            starting = [w for w in self.workers if w.alive]
            if not starting:
                raise EngineError("no engine worker is running")
            waits = [asyncio.ensure_future(w.ready.wait()) for w in starting]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            ready = [w for w in starting if w.alive and w.ready.is_set()]
            if not ready:
                raise EngineError("the engine workers failed to start; see the server log")
        return min(ready, key=lambda w: len(w.engines))

    def _spawn(self, index: int) -> WorkerProcess:
        return WorkerProcess(index, self._init, self._worker_exited, self._catalog)

    def _worker_exited(self, worker: WorkerProcess, reason: str) -> None:
        lost, worker.engines = list(worker.engines), set()
        if self._closing:
            return
        log.error("engine worker %s died with %d engine(s); starting a replacement", worker.pid, len(lost))
        if lost:
            self.on_lost(lost, reason)
        if worker in self.workers and worker.ready.is_set():  # never loop on a worker that cannot start
            self.workers[self.workers.index(worker)] = self._spawn(worker.index)
            self.replaced += 1


async def _read(reader: asyncio.StreamReader) -> Any:
    header = await reader.readexactly(HEADER.size)
    return pickle.loads(await reader.readexactly(HEADER.unpack(header)[0]))


def _pickle_factory(factory: Callable[..., Any]) -> bytes:
    try:
        return pickle.dumps(factory)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"an env hosted in worker processes needs a factory importable by name (a module-level class "
            f"or function), not {factory!r}: {exc}"
        ) from exc


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def default_workers() -> int:
    """One worker per CPU core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
