"""Sessions: one engine instance each, created, stepped, expired and freed here.

Engine calls are blocking (a game interpreter, a JVM, a browser), so they run on a thread
pool and never on the event loop. Calls on one session are serialized by its own lock;
calls on different sessions run concurrently. Capacity is reserved before an engine is
built, so a burst of creates can never overshoot ``max_sessions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentgym.core import TextEnv
from agentgym.errors import AgentGymError, AtCapacity, EngineError, UnknownSession

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Session:
    session_id: str
    compat_id: int
    """Integer id for the AgentGym-compatible routes."""
    env: TextEnv
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

    ``env_factory`` builds a fresh engine per session; ``ttl`` is the idle time (seconds)
    after which a session is evicted and its engine closed.
    """

    def __init__(
        self,
        env_factory: Callable[[], TextEnv],
        *,
        max_sessions: int = 64,
        ttl: float = 600.0,
        engine_threads: int = 16,
        step_deadline: float | None = None,
        reset_deadline: float | None = None,
    ) -> None:
        self._env_factory = env_factory
        self.step_deadline = step_deadline
        """Seconds an engine call may take (the default of :meth:`call`); None: no limit."""
        self.reset_deadline = reset_deadline
        """Seconds a reset may take (callers pass it): longer, as it may wait for a game to be built."""
        self.max_sessions = max_sessions
        self.ttl = ttl
        self._sessions: dict[str, Session] = {}
        self._by_compat_id: dict[int, str] = {}
        self._compat_ids = itertools.count()
        self._reserved = 0
        self._executor = ThreadPoolExecutor(engine_threads, thread_name_prefix="engine")
        self._reaper: asyncio.Task | None = None
        self.stats = SessionStats()
        self.stuck_calls = 0
        """Engine calls past their deadline that have not returned yet (their threads are
        busy until they do: a thread stuck in C code cannot be killed)."""

    # ----- lifecycle ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sessions)

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_forever())

    async def shutdown(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for session_id in list(self._sessions):
            with contextlib.suppress(UnknownSession):  # closed meanwhile by a request
                await self.close(session_id)
        # Never wait for a stuck engine thread: shutdown must finish in bounded time.
        self._executor.shutdown(wait=not self.stuck_calls, cancel_futures=True)

    async def run_engine(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking engine work on the pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    # ----- sessions -----------------------------------------------------------------

    async def open(self) -> Session:
        """Build a session with a fresh engine and no episode yet."""
        self._reserve_slot()
        try:
            env = await self.run_engine(self._env_factory)
        except AgentGymError:
            raise
        except Exception as exc:
            log.exception("engine construction failed")
            raise EngineError(f"could not start the environment engine: {exc}") from exc
        finally:
            self._reserved -= 1
        session = Session(uuid.uuid4().hex, next(self._compat_ids), env)
        self._sessions[session.session_id] = session
        self._by_compat_id[session.compat_id] = session.session_id
        self.stats.created += 1
        return session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSession(f"no session {session_id!r} (never created, closed or expired)")
        return session

    def get_compat(self, compat_id: int) -> Session:
        session_id = self._by_compat_id.get(compat_id)
        if session_id is None:
            raise UnknownSession(f"no environment with id {compat_id} (never created, closed or expired)")
        return self.get(session_id)

    async def call(
        self,
        session: Session,
        method: Callable[..., T],
        *args: Any,
        deadline: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``method`` (bound to ``session.env``) under the session's lock.

        Contract errors (bad action, episode over, ...) pass through and leave the
        session usable; any other exception means the engine is broken, so the session
        is closed and a 503 is raised. So is a call that takes longer than ``deadline``
        seconds (default: ``step_deadline``): the session is dropped at once (its lock freed, so DELETE and the reaper
        never hang on it) and its engine closed whenever the stuck call returns.
        """
        deadline = deadline or self.step_deadline
        async with session.lock:
            if session.closed:
                raise UnknownSession(f"session {session.session_id!r} was closed")
            session.last_active = time.monotonic()
            future = self._executor.submit(lambda: method(*args, **kwargs))
            try:
                return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), deadline)
            except AgentGymError:
                raise
            except TimeoutError:
                log.error("engine call in session %s passed its %gs deadline", session.session_id, deadline)
                self.stats.engine_errors += 1
                self._abandon(session, future)
                raise EngineError(
                    f"the environment engine did not answer within {deadline:g}s; the session was closed"
                ) from None
            except Exception as exc:
                log.exception("engine failure in session %s", session.session_id)
                self.stats.engine_errors += 1
                await self._close_locked(session)
                raise EngineError(f"the environment engine failed and the session was closed: {exc}") from exc
            finally:
                session.last_active = time.monotonic()

    async def close(self, session_id: str) -> None:
        session = self.get(session_id)
        async with session.lock:
            if session.closed:  # a concurrent close got the lock first: only one 204
                raise UnknownSession(f"session {session_id!r} was closed")
            await self._close_locked(session)

    async def evict_expired(self) -> int:
        """Close sessions idle for longer than ``ttl``; return how many."""
        now = time.monotonic()
        idle = [s for s in self._sessions.values() if now - s.last_active > self.ttl and not s.lock.locked()]
        expired = 0
        for session in idle:
            async with session.lock:
                # A call may have taken the lock (and used the session) since the scan.
                if not session.closed and time.monotonic() - session.last_active > self.ttl:
                    await self._close_locked(session)
                    self.stats.expired += 1
                    expired += 1
        return expired

    # ----- internals ----------------------------------------------------------------

    def _reserve_slot(self) -> None:
        if len(self._sessions) + self._reserved >= self.max_sessions:
            self.stats.rejected += 1
            raise AtCapacity(
                f"server is at capacity ({self.max_sessions} sessions); close a session or retry later",
                retry_after=self._retry_after(),
            )
        self._reserved += 1

    def _retry_after(self) -> float:
        """Seconds until the oldest idle session expires (at least 1)."""
        if not self._sessions:
            return 1.0
        oldest = min(s.last_active for s in self._sessions.values())
        return max(1.0, self.ttl - (time.monotonic() - oldest))

    def _abandon(self, session: Session, stuck: Future) -> None:
        """Drop a session whose engine call is stuck; close its engine in that call's own
        thread once (if ever) it returns, so nothing touches the engine while it runs."""
        session.closed = True
        self._sessions.pop(session.session_id, None)
        self._by_compat_id.pop(session.compat_id, None)
        self.stats.closed += 1
        self.stuck_calls += 1

        def close_when_done(_: Future) -> None:
            self.stuck_calls -= 1
            try:
                session.env.close()
            except Exception:
                log.exception("closing the engine of abandoned session %s failed", session.session_id)

        stuck.add_done_callback(close_when_done)

    async def _close_locked(self, session: Session) -> None:
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.session_id, None)
        self._by_compat_id.pop(session.compat_id, None)
        self.stats.closed += 1
        try:
            await self.run_engine(session.env.close)
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
