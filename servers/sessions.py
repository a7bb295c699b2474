"""Sessions: one engine instance each, created, stepped, expired and freed here.

Engine calls are blocking (a game interpreter, a JVM, a browser), so they never run on the
event loop: an :class:`EngineHost` runs them, either on a thread pool of this process
(:class:`ThreadEngines`) or in worker processes (:class:`~agentgym.servers.workers.WorkerEngines`,
for envs whose ``engine_process`` is set). Calls on one session are serialized by its own
lock; calls on different sessions run concurrently. Capacity (and a client's quota) is
reserved before an engine is built, so a burst of creates can never overshoot ``max_sessions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentgym.contract.core import TextEnv
from agentgym.contract.errors import AgentGymError, AtCapacity, EngineError, UnknownSession
from agentgym.hosting import DEFAULT_MAX_SESSIONS

log = logging.getLogger(__name__)

LOST_SESSIONS_KEPT = 4096
"""Sessions lost with a dead worker whose next request still answers 503 (not 404)."""

COMPAT_ID_LIMIT = 2**53
"""Integer ids are below this: exact as a JSON number in any client (a double)."""


class EngineTimeout(RuntimeError):
    """An engine call passed its deadline (the session manager answers 503)."""


class EngineHost(Protocol):
    """Where session engines live and their calls run. ``engine`` is whatever ``build``
    returned; it has ``TextEnv``'s read-only state (``current_task``, ``turn``, ``done``,
    ``last_observation``, ``last_info``) for the routes that read a session without a call."""

    stuck_calls: int
    replaced: int
    """Worker processes replaced after they died (0 for threads)."""
    on_lost: Callable[[list[Any], str], None]

    def pids(self) -> list[int]:
        """Process ids of the live worker processes (none for threads)."""
        ...

    async def start(self) -> None: ...
    async def build(self, deadline: float | None) -> Any: ...
    async def call(
        self, engine: Any, name: str, args: tuple, kwargs: dict, deadline: float | None
    ) -> Any: ...
    def close(self, engine: Any) -> None: ...
    async def shutdown(self) -> None: ...


class ThreadEngines:
    """Engines in this process, their calls on a thread pool. A call past its deadline
    cannot be stopped (a thread stuck in C code cannot be killed): its thread stays busy
    and its engine is closed in that thread if the call ever returns."""

    def __init__(
        self, factory: Callable[[], TextEnv], threads: int = 16, warm_up: Callable[[], None] | None = None
    ) -> None:
        self._factory = factory
        self._warm_up = warm_up
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="engine")
        self.stuck_calls = 0
        """Engine calls past their deadline that have not returned yet."""
        self.replaced = 0
        self.on_lost: Callable[[list[Any], str], None] = lambda engines, reason: None

    async def start(self) -> None:
        if self._warm_up is not None:
            await asyncio.to_thread(self._warm_up)

    def pids(self) -> list[int]:
        return []

    async def build(self, deadline: float | None) -> TextEnv:
        return await self._run(self._factory, None, deadline)

    async def call(
        self, engine: TextEnv, name: str, args: tuple, kwargs: dict, deadline: float | None
    ) -> Any:
        return await self._run(lambda: _invoke(engine, name, args, kwargs), engine, deadline)

    def close(self, engine: TextEnv) -> None:
        """Close in a pool thread without waiting (the caller's session is already gone)."""
        self._executor.submit(_close_logged, engine)

    async def shutdown(self) -> None:
        # Never wait for a stuck engine thread: shutdown must finish in bounded time.
        self._executor.shutdown(wait=not self.stuck_calls, cancel_futures=True)

    async def _run(self, work: Callable[[], Any], engine: TextEnv | None, deadline: float | None) -> Any:
        future = self._executor.submit(work)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), deadline)
        except TimeoutError:
            self._close_when_done(engine, future)
            raise EngineTimeout(f"the environment engine did not answer within {deadline:g}s") from None

    def _close_when_done(self, engine: TextEnv | None, stuck: Future) -> None:
        """Close the engine of a stuck call in that call's own thread once (if ever) it returns,
        so nothing touches the engine while it runs."""
        self.stuck_calls += 1

        def close_when_done(done: Future) -> None:
            self.stuck_calls -= 1
            built = engine if engine is not None else (None if done.exception() else done.result())
            if built is not None:
                _close_logged(built)

        stuck.add_done_callback(close_when_done)


def _invoke(engine: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """``engine.name(*args, **kwargs)``, or the attribute's value when it is not a method."""
    attribute = getattr(engine, name)
    return attribute(*args, **kwargs) if callable(attribute) else attribute


def _close_logged(engine: Any) -> None:
    try:
        engine.close()
    except Exception:
        log.exception("closing an engine failed")


@dataclass
class Session:
    session_id: str
    env: Any
    """The engine handle of its host: a ``TextEnv``, or a worker's mirror of one."""
    compat_id: int | None = None
    """Integer id for the AgentGym-compatible routes: only sessions created there have one."""
    client: str | None = None
    """Whose quota the session counts against (``SessionManager.max_per_client``)."""
    owner: str | None = None
    """Who alone may name the session: None for sessions any holder of the id may use (v1,
    OpenEnv, AgentGym), else a key that every lookup must give (an MCP session's)."""
    created_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False

    def state(self) -> dict[str, Any]:
        task = self.env.current_task
        return {
            "session_id": self.session_id,
            "task_id": task.task_id if task else None,
            "turn": self.env.turn,
            "done": self.env.done,
            "observation": self.env.last_observation,
            "info": self.env.last_info,
            "created_at": self.created_at,
            "last_active": time.time() - (time.monotonic() - self.last_active),
        }


@dataclass
class SessionStats:
    created: int = 0
    closed: int = 0
    expired: int = 0
    rejected: int = 0
    engine_errors: int = 0


class SessionManager:
    """Owns every live session of one server.

    ``host`` builds a fresh engine per session and runs its calls; ``ttl`` is the idle time
    (seconds) after which a session is evicted and its engine closed.
    """

    def __init__(
        self,
        host: EngineHost,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        ttl: float = 600.0,
        step_deadline: float | None = None,
        reset_deadline: float | None = None,
        max_per_client: int | None = None,
    ) -> None:
        self.host = host
        host.on_lost = self._engines_lost
        self.step_deadline = step_deadline
        """Seconds an engine call may take (the default of :meth:`call`); None: no limit."""
        self.reset_deadline = reset_deadline
        """Seconds a reset may take (callers pass it): longer, as it may wait for a game to be built."""
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client
        """Live sessions one client may hold (None: no quota), so that no client can take
        every slot."""
        self.ttl = ttl
        self._sessions: dict[str, Session] = {}
        self._by_compat_id: dict[int, str] = {}
        self._reserved = 0
        self._per_client: Counter[str] = Counter()
        """Live and reserved sessions by client."""
        self._lost: OrderedDict[str, str] = OrderedDict()
        """Sessions whose worker died under them while idle -> why (their next request's 503)."""
        self._lost_compat: OrderedDict[int, str] = OrderedDict()
        self._reaper: asyncio.Task | None = None
        self.stats = SessionStats()

    @property
    def stuck_calls(self) -> int:
        """Engine calls past their deadline still running (threads only: a worker is killed)."""
        return self.host.stuck_calls

    # ----- lifecycle ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sessions)

    async def start(self) -> None:
        await self.host.start()
        self._reaper = asyncio.create_task(self._reap_forever())

    async def shutdown(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for session in list(self._sessions.values()):
            with contextlib.suppress(UnknownSession):  # closed meanwhile by a request
                await self.close(session.session_id, owner=session.owner)
        await self.host.shutdown()

    # ----- sessions -----------------------------------------------------------------

    async def open(
        self, *, client: str | None = None, compat: bool = False, owner: str | None = None
    ) -> Session:
        """Build a session with a fresh engine and no episode yet, counted against
        ``client``'s quota; ``compat``: give it an integer id (AgentGym's ``/create``);
        ``owner``: only lookups that give it find the session (:attr:`Session.owner`)."""
        self._reserve_slot(client)
        try:
            env = await self._build()
        except BaseException:  # cancelled too: the reserved place in the quota goes back
            self._release(client)
            raise
        finally:
            self._reserved -= 1
        compat_id = self._new_compat_id() if compat else None
        session = Session(uuid.uuid4().hex, env, compat_id, client, owner)
        self._sessions[session.session_id] = session
        if session.compat_id is not None:
            self._by_compat_id[session.compat_id] = session.session_id
        self.stats.created += 1
        return session

    async def _build(self) -> Any:
        try:
            return await self.host.build(self.reset_deadline)
        except AgentGymError:
            raise
        except Exception as exc:
            log.exception("engine construction failed")
            self.stats.engine_errors += 1
            raise EngineError(f"could not start the environment engine: {exc}") from exc

    def get(self, session_id: str, owner: str | None = None) -> Session:
        """The live session ``session_id`` if ``owner`` is its owner (an owned session is
        refused exactly as one that does not exist)."""
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            reason = self._lost.pop(session_id, None)
            if reason is not None:
                raise EngineError(f"the session was closed: {reason}")
            raise UnknownSession(f"no session {session_id!r} (never created, closed or expired)")
        return session

    def get_compat(self, compat_id: int) -> Session:
        session_id = self._by_compat_id.get(compat_id) or self._lost_compat.pop(compat_id, None)
        if session_id is None:
            raise UnknownSession(f"no environment with id {compat_id} (never created, closed or expired)")
        return self.get(session_id)

    async def call(
        self,
        session: Session,
        method: str,
        *args: Any,
        deadline: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call the engine's ``method`` (a ``TextEnv`` method name, e.g. ``"step"``) under the
        session's lock.

        Contract errors (bad action, episode over, ...) pass through and leave the
        session usable; any other exception means the engine is broken, so the session
        is closed and a 503 is raised. So is a call that takes longer than ``deadline``
        seconds (default: ``step_deadline``): the session is dropped at once (its lock
        freed, so DELETE and the reaper never hang on it) and the host ends the call as
        far as it can (a worker process is killed; a thread's engine is closed when the
        call returns).
        """
        deadline = deadline or self.step_deadline
        async with session.lock:
            if session.closed:
                raise UnknownSession(f"session {session.session_id!r} was closed")
            session.last_active = time.monotonic()
            try:
                return await self.host.call(session.env, method, args, kwargs, deadline)
            except AgentGymError:
                raise
            except EngineTimeout as exc:
                log.error("engine call in session %s passed its %gs deadline", session.session_id, deadline)
                self._fail(session, close_engine=False)
                raise EngineError(f"{exc}; the session was closed") from None
            except Exception as exc:
                log.error("engine failure in session %s: %s", session.session_id, exc)
                self._fail(session, close_engine=True)
                raise EngineError(f"the environment engine failed and the session was closed: {exc}") from exc
            finally:
                session.last_active = time.monotonic()

    async def close(self, session_id: str, owner: str | None = None) -> None:
        session = self.get(session_id, owner)
        async with session.lock:
            if session.closed:  # a concurrent close got the lock first: only one 204
                raise UnknownSession(f"session {session_id!r} was closed")
            self._drop(session, close_engine=True)

    async def evict_expired(self) -> int:
        """Close sessions idle for longer than ``ttl``; return how many."""
        now = time.monotonic()
        idle = [s for s in self._sessions.values() if now - s.last_active > self.ttl and not s.lock.locked()]
        expired = 0
        for session in idle:
            async with session.lock:
                # A call may have taken the lock (and used the session) since the scan.
                if not session.closed and time.monotonic() - session.last_active > self.ttl:
                    self._drop(session, close_engine=True)
                    self.stats.expired += 1
                    expired += 1
        return expired

    # ----- internals ----------------------------------------------------------------

    def _reserve_slot(self, client: str | None) -> None:
        if len(self._sessions) + self._reserved >= self.max_sessions:
            self.stats.rejected += 1
            raise AtCapacity(
                f"server is at capacity ({self.max_sessions} sessions); close a session or retry later",
                retry_after=self._retry_after(self._sessions.values()),
            )
        if client is not None and self.max_per_client is not None:
            if self._per_client[client] >= self.max_per_client:
                self.stats.rejected += 1
                raise AtCapacity(
                    f"this client holds its quota of {self.max_per_client} sessions; close one or retry later",
                    retry_after=self._retry_after(s for s in self._sessions.values() if s.client == client),
                )
            self._per_client[client] += 1
        self._reserved += 1

    def _release(self, client: str | None) -> None:
        """Give back a session's place in its client's quota."""
        if client is not None and client in self._per_client:
            self._per_client[client] -= 1
            if not self._per_client[client]:
                del self._per_client[client]  # a client with no session costs no memory

    def _new_compat_id(self) -> int:
        """A random integer id no live or lost session has. Random, not counted: no client
        can guess another's session by counting, and an id from before a restart names
        nothing (it is refused, never another session)."""
        while True:
            compat_id = 1 + secrets.randbelow(COMPAT_ID_LIMIT - 1)
            if compat_id not in self._by_compat_id and compat_id not in self._lost_compat:
                return compat_id

    def _retry_after(self, sessions: Iterable[Session]) -> float:
        """Seconds until the oldest idle one of ``sessions`` expires (at least 1)."""
        oldest = min((s.last_active for s in sessions), default=None)
        return 1.0 if oldest is None else max(1.0, self.ttl - (time.monotonic() - oldest))

    def _fail(self, session: Session, *, close_engine: bool) -> None:
        """Drop a session whose engine broke, counting the engine error once (a session lost
        with its worker was counted when the worker died)."""
        if session.closed:
            return
        self.stats.engine_errors += 1
        self._drop(session, close_engine=close_engine)

    def _engines_lost(self, engines: list[Any], reason: str) -> None:
        """A worker died with these engines: fail their sessions now (freeing capacity). A
        session in the middle of a call gets its 503 from that call; an idle one from its
        next request."""
        lost = set(engines)
        for session in [s for s in self._sessions.values() if s.env in lost]:
            log.error("session %s lost: %s", session.session_id, reason)
            self._fail(session, close_engine=False)
            if not session.lock.locked():
                self._lost[session.session_id] = reason
                if session.compat_id is not None:
                    self._lost_compat[session.compat_id] = session.session_id
        for kept in (self._lost, self._lost_compat):
            while len(kept) > LOST_SESSIONS_KEPT:
                kept.popitem(last=False)

    def _drop(self, session: Session, *, close_engine: bool) -> None:
        """Forget the session; its engine is closed by the host without waiting for it."""
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.session_id, None)
        if session.compat_id is not None:
            self._by_compat_id.pop(session.compat_id, None)
        self._release(session.client)
        self.stats.closed += 1
        if close_engine:
            try:
                self.host.close(session.env)
            except Exception:
                log.exception("closing the engine of session %s failed", session.session_id)

    async def _reap_forever(self) -> None:
        interval = max(0.05, min(30.0, self.ttl / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.evict_expired()
            except Exception:
                log.exception("session reaper failed")
