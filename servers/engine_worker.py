"""Engine worker: a child process that hosts the engines of one env and runs their calls.

:mod:`agentgym.servers.workers` starts it as ``python -m agentgym.servers.engine_worker FD``
with one end of a socket pair as ``FD``. Engines (``TextEnv`` instances) live here, so the
server's event loop never runs engine code, an engine that segfaults takes only this
process down, and a call stuck in C code can be ended by killing the process.

Protocol: frames of a 4-byte big-endian length and a pickle (both ends are this package;
the socket pair is private to the two processes). The first frame from the server is a
:class:`WorkerInit`; the worker answers ``READY`` once the env's module is imported and its
engines warmed. Then requests ``(request_id, op, engine_id, name, args, kwargs)``:

* ``open``: build an engine (the env's factory with its config) under ``engine_id``;
* ``call``: ``getattr(engine, name)(*args, **kwargs)``, or the attribute's value when it
  is not callable;
* ``close``: close and forget the engine (no reply: the server never waits for it).
* ``abort``: the engine's call passed the server's deadline: run the engine's ``abort()``
  at once, beside the stuck call, if the engine has one (it must not block; sciworld's kills
  its JVM so that the call fails and frees its thread). No reply; the server kills the
  worker if the call does not return soon after.

Replies are ``(request_id, ok, value, snapshot)``: ``value`` is the result, or when not
``ok`` an encoded error (:func:`encode_error`); ``snapshot`` is the engine's state the
server mirrors (:func:`snapshot`). An engine may ask the server's catalog instance for
shared work (``TextEnv.on_catalog``, e.g. a textworld game from the server's one generation
queue): the worker sends ``("catalog", id, method, args)`` and the server answers
``("catalog", id, ok, value)``. Requests for one engine run in arrival order, requests
for different engines concurrently on a thread pool (a sciworld engine waits on its JVM,
a textworld reset may wait for its game to be generated). EOF on the socket (the server
closed it or died) closes every engine and ends the process.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("agentgym.engine_worker")

HEADER = struct.Struct("!I")
READY = "ready"
CLOSE_ON_EXIT_S = 10.0
"""How long a worker whose server went away waits for its engines to close before exiting."""


@dataclass
class WorkerInit:
    """The first frame: how to build engines. ``factory`` is pickled separately so that it is
    unpickled only after ``sys_path`` is in place (a test's env class lives in its folder)."""

    sys_path: list[str]
    factory: bytes
    config: dict[str, Any]
    threads: int
    warm: int = 0
    """Engines to keep started ahead in this process (``TextEnv.warm_engines``)."""


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def read_frame(sock: socket.socket) -> Any:
    """The next message, or ``None`` at EOF."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def encode_error(exc: BaseException) -> tuple[Any, ...]:
    """A contract error (``AgentGymError``: bad action, episode over, ...) travels as its class,
    message and retry-after, so the server raises the same error; anything else is an engine
    failure and travels as text."""
    from agentgym.contract.errors import AgentGymError

    if isinstance(exc, AgentGymError):
        return ("agentgym", type(exc), exc.message, exc.retry_after)
    return ("engine", f"{type(exc).__name__}: {exc}")


def decode_error(encoded: tuple[Any, ...]) -> Exception:
    """The exception :func:`encode_error` encoded (an engine failure as a RuntimeError)."""
    if encoded[0] == "agentgym":
        _, cls, message, retry_after = encoded
        return cls(message, retry_after=retry_after)
    return RuntimeError(encoded[1])


def snapshot(engine: Any) -> dict[str, Any]:
    """What the server reads from a session without an engine call: the episode state, the
    env's AgentGym-compat fields (``compat_fields``) and the attributes it lists in
    ``mirrored_attributes``. Sent with every reply; pickling it with the result stores the
    observation and info once."""
    state = {
        "current_task": engine.current_task,
        "turn": engine.turn,
        "done": engine.done,
        "last_observation": engine.last_observation,
        "last_info": engine.last_info,
        "extras": {name: getattr(engine, name) for name in getattr(engine, "mirrored_attributes", ())},
    }
    compat_fields = getattr(engine, "compat_fields", None)
    if compat_fields is not None and engine.current_task is not None:
        state["compat"] = {route: compat_fields(route) for route in ("reset", "step")}
    return state


@dataclass
class _EngineQueue:
    """Requests of one engine, run one at a time in arrival order."""

    pending: deque = field(default_factory=deque)
    running: bool = False


class Worker:
    """The worker's engines and the dispatch of requests onto its threads."""

    def __init__(self, sock: socket.socket, factory: Callable[..., Any], init: WorkerInit) -> None:
        self.sock, self.factory, self.config = sock, factory, init.config
        self.engines: dict[int, Any] = {}
        self.executor = ThreadPoolExecutor(init.threads, thread_name_prefix="engine")
        self._queues: dict[int, _EngineQueue] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._catalog_ids = itertools.count()
        self._catalog_replies: dict[int, Future] = {}

    def serve(self) -> None:
        while (message := read_frame(self.sock)) is not None:
            if message[0] == "catalog":
                _, call_id, ok, value = message
                self._catalog_replies.pop(call_id).set_result((ok, value))
            elif message[1] == "abort":
                self.abort(message[2])
            else:
                self.dispatch(message)

    def abort(self, engine_id: int) -> None:
        """Run the engine's ``abort()`` now, not queued behind the call it is to stop."""
        abort = getattr(self.engines.get(engine_id), "abort", None)
        if abort is None:
            return
        try:
            abort()
        except Exception:
            log.exception("aborting engine %s failed", engine_id)

    def call_catalog(self, method: str, *args: Any) -> Any:
        """Run ``method`` of the server's catalog instance (an engine thread waits for it)."""
        reply: Future = Future()
        with self._lock:
            call_id = next(self._catalog_ids)
            self._catalog_replies[call_id] = reply
        self._send(frame(("catalog", call_id, method, args)))
        ok, value = reply.result()
        if not ok:
            raise decode_error(value)
        return value

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(data)

    def dispatch(self, message: tuple) -> None:
        engine_id = message[2]
        with self._lock:
            queue = self._queues.setdefault(engine_id, _EngineQueue())
            queue.pending.append(message)
            if queue.running:
                return
            queue.running = True
        self.executor.submit(self._drain, engine_id, queue)

    def _drain(self, engine_id: int, queue: _EngineQueue) -> None:
        while True:
            with self._lock:
                if not queue.pending:
                    queue.running = False
                    if engine_id not in self.engines:
                        self._queues.pop(engine_id, None)
                    return
                message = queue.pending.popleft()
            self._handle(*message)

    def _handle(
        self, request_id: int | None, op: str, engine_id: int, name: str, args: tuple, kwargs: dict
    ) -> None:
        try:
            if op == "close":
                engine = self.engines.pop(engine_id, None)
                if engine is not None:
                    engine.close()
                return
            if op == "open":
                engine = self.engines[engine_id] = self.factory(**self.config)
                engine.catalog_link = self.call_catalog
                value: Any = None
            else:
                engine = self.engines[engine_id]
                attribute = getattr(engine, name)
                value = attribute(*args, **kwargs) if callable(attribute) else attribute
            reply = frame((request_id, True, value, snapshot(engine)))
        except Exception as exc:
            if op == "close":
                log.exception("closing engine %s failed", engine_id)
                return
            reply = frame((request_id, False, encode_error(exc), None))
        self._send(reply)

    def close_all(self) -> None:
        for engine in list(self.engines.values()):
            with contextlib.suppress(Exception):
                engine.close()


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group: the server shuts its workers
    # down itself (EOF on their sockets), so a worker must not die of the SIGINT first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s engine-worker %(process)d %(message)s")
    sock = socket.socket(fileno=int(sys.argv[1]))
    init: WorkerInit = read_frame(sock)
    sys.path[:] = init.sys_path
    factory = pickle.loads(init.factory)
    worker = Worker(sock, factory, init)
    if init.warm:
        factory(**init.config).warm_engines(init.warm)
    worker._send(frame(READY))
    try:
        worker.serve()
    finally:
        # Engines close in a thread so that one stuck in C code cannot keep the process alive.
        closer = threading.Thread(target=worker.close_all, daemon=True)
        closer.start()
        closer.join(CLOSE_ON_EXIT_S)
        os._exit(0)


if __name__ == "__main__":
    main()
