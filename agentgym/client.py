"""Python clients of wire API v1: :class:`EnvClient` (sync) and :class:`AsyncEnvClient`.

Both pool connections, time out, retry with exponential backoff and return the typed
models of :mod:`agentgym.wire`. Server errors come back as the exceptions of
:mod:`agentgym.errors` (``UnknownSession``, ``EpisodeOver``, ...).

Retries never repeat a step that may have reached the engine: a ``step`` is retried only
when it was refused before running (429, or the connection could not be opened).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from agentgym.errors import AgentGymError, error_from_body
from agentgym.wire import (
    Health,
    Metadata,
    ResetResult,
    SessionCreated,
    SessionState,
    StepResult,
    TaskList,
)

M = TypeVar("M", bound=BaseModel)
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors raised before the request reached the server: always safe to retry."""


@dataclass
class _Call:
    """One HTTP request and how to read its answer."""

    method: str
    path: str
    model: type[BaseModel] | None = None
    json: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    idempotent: bool = True
    """Safe to resend after a timeout or 503 (the server did nothing, or doing it twice is harmless)."""


@dataclass
class RetryPolicy:
    attempts: int = 5
    """Tries in total, the first included."""
    backoff: float = 0.25
    """First wait in seconds; doubles each retry (with jitter), capped by ``max_wait``."""
    max_wait: float = 8.0
    retry_statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 503}))

    def wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_wait)
        return min(self.max_wait, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)

    def should_retry(self, call: _Call, attempt: int, status: int | None, exc: Exception | None) -> bool:
        if attempt + 1 >= self.attempts:
            return False
        if isinstance(exc, NEVER_SENT) or status == 429:
            return True
        if exc is not None:
            return call.idempotent and isinstance(exc, httpx.TransportError)
        return call.idempotent and status in self.retry_statuses


def _endpoint(build: Callable[..., _Call]) -> Callable[..., Any]:
    """Turn a request builder into a client method; ``_send`` makes it sync or async."""

    @functools.wraps(build)
    def method(self: _Endpoints, *args: Any, **kwargs: Any) -> Any:
        return self._send(build(self, *args, **kwargs))

    return method


def _session_body(task_id, split, index, seed, options) -> dict[str, Any]:
    body = {"task_id": task_id, "split": split, "index": index, "seed": seed, "options": options}
    return {key: value for key, value in body.items() if value is not None}


class _Endpoints:
    """The wire API v1 routes, shared by the sync and the async client."""

    def _send(self, call: _Call) -> Any:
        raise NotImplementedError

    @_endpoint
    def health(self) -> Health:
        return _Call("GET", "/health", Health)

    @_endpoint
    def metadata(self) -> Metadata:
        return _Call("GET", "/metadata", Metadata)

    @_endpoint
    def tasks(self, split: str | None = None, offset: int = 0, limit: int = 100) -> TaskList:
        params = {"offset": offset, "limit": limit} | ({"split": split} if split else {})
        return _Call("GET", "/tasks", TaskList, params=params)

    @_endpoint
    def create(
        self,
        task_id: str | None = None,
        *,
        split: str | None = None,
        index: int | None = None,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> SessionCreated:
        body = _session_body(task_id, split, index, seed, options)
        return _Call("POST", "/sessions", SessionCreated, json=body)

    @_endpoint
    def reset(
        self,
        session_id: str,
        task_id: str | None = None,
        *,
        split: str | None = None,
        index: int | None = None,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> ResetResult:
        body = _session_body(task_id, split, index, seed, options)
        return _Call("POST", f"/sessions/{session_id}/reset", ResetResult, json=body)

    @_endpoint
    def step(self, session_id: str, action: str) -> StepResult:
        return _Call(
            "POST", f"/sessions/{session_id}/step", StepResult, json={"action": action}, idempotent=False
        )

    @_endpoint
    def state(self, session_id: str) -> SessionState:
        return _Call("GET", f"/sessions/{session_id}", SessionState)

    @_endpoint
    def delete(self, session_id: str) -> None:
        return _Call("DELETE", f"/sessions/{session_id}")


class _ClientBase(_Endpoints):
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 256,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._client_kwargs: dict[str, Any] = {
            "base_url": self.base_url,
            "timeout": httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            "limits": httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            "headers": {"Authorization": f"Bearer {token}"} if token else {},
        }

    def _retry_wait(
        self, call: _Call, attempt: int, response: httpx.Response | None, exc: Exception | None
    ) -> float | None:
        """Seconds to wait before the next attempt, or ``None`` to stop here."""
        status = response.status_code if response is not None else None
        if not self.retry.should_retry(call, attempt, status, exc):
            return None
        retry_after = _error_of(response).retry_after if response is not None else None
        return self.retry.wait(attempt, retry_after)

    @staticmethod
    def _finish(call: _Call, response: httpx.Response | None, exc: Exception | None) -> Any:
        if exc is not None:
            raise exc
        assert response is not None
        if response.status_code >= 400:
            raise _error_of(response)
        if call.model is None:
            return None
        return call.model.model_validate(response.json())


def _error_of(response: httpx.Response) -> AgentGymError:
    try:
        body: object = response.json()
    except ValueError:
        body = response.text
    retry_after = response.headers.get("retry-after")
    return error_from_body(response.status_code, body, float(retry_after) if retry_after else None)


class EnvClient(_ClientBase):
    """Blocking client. Use as a context manager or call :meth:`close`."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._http = httpx.Client(**self._client_kwargs)

    def _send(self, call: _Call) -> Any:
        for attempt in itertools.count():
            response, error = None, None
            try:
                response = self._http.request(call.method, call.path, json=call.json, params=call.params)
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry_wait(call, attempt, response, error)
            if wait is None:
                return self._finish(call, response, error)
            time.sleep(wait)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEnvClient(_ClientBase):
    """asyncio client; many sessions can be driven concurrently over one pool."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._http = httpx.AsyncClient(**self._client_kwargs)

    async def _send(self, call: _Call) -> Any:
        for attempt in itertools.count():
            response, error = None, None
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params
                )
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry_wait(call, attempt, response, error)
            if wait is None:
                return self._finish(call, response, error)
            await asyncio.sleep(wait)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
