"""Python clients of wire API v1: :class:`EnvClient` (sync) and :class:`AsyncEnvClient`.

Both pool connections, time out, retry with exponential backoff and return the typed
models of :mod:`agentgym.wire`. Server errors come back as the exceptions of
:mod:`agentgym.contract.errors` (``UnknownSession``, ``EpisodeOver``, ...); transport failures as
httpx's (``httpx.ConnectError``, ``httpx.ReadTimeout``, ... all ``httpx.TransportError``),
whichever library carried the request.

Retries never repeat a step that may have reached the engine: a ``step`` is retried only
when it was refused before running (429, or the connection could not be opened).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import httpx
from pydantic import BaseModel

from agentgym.contract.errors import AgentGymError, error_from_body
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
class _Reply:
    """An HTTP answer, as either transport hands it over."""

    status: int
    headers: Mapping[str, str]
    body: bytes


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
        self._timeout = timeout
        self._connect_timeout = min(timeout, 10.0)
        self._max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _retry_wait(
        self, call: _Call, attempt: int, reply: _Reply | None, exc: Exception | None
    ) -> float | None:
        """Seconds to wait before the next attempt, or ``None`` to stop here."""
        status = reply.status if reply is not None else None
        if not self.retry.should_retry(call, attempt, status, exc):
            return None
        retry_after = _error_of(reply).retry_after if reply is not None else None
        return self.retry.wait(attempt, retry_after)

    @staticmethod
    def _finish(call: _Call, reply: _Reply | None, exc: Exception | None) -> Any:
        if exc is not None:
            raise exc
        assert reply is not None
        if reply.status >= 400:
            raise _error_of(reply)
        if call.model is None:
            return None
        return call.model.model_validate_json(reply.body)


def _error_of(reply: _Reply) -> AgentGymError:
    try:
        body: object = json.loads(reply.body)
    except ValueError:
        body = reply.body.decode(errors="replace")
    retry_after = reply.headers.get("retry-after")
    return error_from_body(reply.status, body, float(retry_after) if retry_after else None)


class EnvClient(_ClientBase):
    """Blocking client. Use as a context manager or call :meth:`close`."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(self._timeout, connect=self._connect_timeout),
            limits=httpx.Limits(
                max_connections=self._max_connections, max_keepalive_connections=self._max_connections
            ),
            headers=self._headers,
        )

    def _send(self, call: _Call) -> Any:
        for attempt in itertools.count():
            reply, error = None, None
            try:
                response = self._http.request(call.method, call.path, json=call.json, params=call.params)
                reply = _Reply(response.status_code, response.headers, response.content)
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry_wait(call, attempt, reply, error)
            if wait is None:
                return self._finish(call, reply, error)
            time.sleep(wait)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEnvClient(_ClientBase):
    """asyncio client; many sessions can be driven concurrently over one pool.

    It runs on aiohttp, whose pool hands out a connection in constant time: httpx's scans
    and probes every pooled connection on each request, which at 64 sessions cost 12.8 ms
    of client CPU per step against aiohttp's 0.5 ms (bench/RESULTS.md, issue 18)."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop it then belongs to (aiohttp's rule).
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=self._timeout,  # waiting for a free pooled connection included, as httpx's pool timeout
                    sock_connect=self._connect_timeout,
                    sock_read=self._timeout,
                ),
                headers=self._headers,
            )
        return self._session

    async def _request(self, call: _Call) -> _Reply:
        try:
            async with self._http().request(
                call.method, self.base_url + call.path, json=call.json, params=call.params
            ) as response:
                return _Reply(response.status, response.headers, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _as_httpx_error(exc) from exc

    async def _send(self, call: _Call) -> Any:
        for attempt in itertools.count():
            reply, error = None, None
            try:
                reply = await self._request(call)
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry_wait(call, attempt, reply, error)
            if wait is None:
                return self._finish(call, reply, error)
            await asyncio.sleep(wait)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _as_httpx_error(exc: aiohttp.ClientError | TimeoutError) -> httpx.TransportError:
    """The httpx exception for an aiohttp failure, so that both clients raise the same types
    (and ``NEVER_SENT`` keeps telling which failures left the server untouched)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(message)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(message)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message)
    return httpx.TransportError(message)
