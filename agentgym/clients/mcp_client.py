"""Any MCP server of AgentGym's tool contract as an AgentGym env server: :class:`McpEnvClient`
has the async interface of :class:`agentgym.clients.env_client.AsyncEnvClient` that rollouts, ``eval``
and ``train`` use, and plays each episode in an MCP session of its own (the official SDK's
streamable HTTP client).

An ``http(s)://`` URL whose path ends in ``/mcp`` names an MCP server wherever an env URL
is taken (``agentgym eval --url http://host:port/mcp``); ``env_client`` picks the client by
it. The contract (docs/mcp.md), which every AgentGym env server's ``/mcp`` serves:

* ``env_info`` answers v1's ``/metadata``, ``list_tasks(split, offset, limit)`` v1's
  ``/tasks``, ``start_episode(task_id | split + index | seed, options)`` v1's create
  (``observation``, ``info``), and each action tool v1's step (``observation``, ``reward``,
  ``terminated``, ``truncated``, ``info``), all as the result's structured content.
* An action goes to the tool its verb names when it reads ``verb[text]`` and the server
  has a tool ``verb`` with one required string argument (``search[cats]`` ->
  ``search(query="cats")``), else to ``act(action)``; with neither it is refused as an
  invalid action (a spent turn, as a server's 400 is).
* A tool error whose structured content is AgentGym's error body raises that error (an
  invalid action, an unknown task, ...); another tool error of an action tool is an
  invalid action, of any other tool an engine error.
* Deleting the MCP session ends its episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from agentgym.clients.env_client import RetryPolicy
from agentgym.contract.errors import (
    AgentGymError,
    EngineError,
    InvalidAction,
    SchemaError,
    Unauthorized,
    UnknownSession,
    error_from_body,
)
from agentgym.wire import Health, Metadata, SessionCreated, StepResult, TaskList

ACT_TOOL = "act"
_TYPED_ACTION = re.compile(r"([a-z][a-z_]*)\[(.*)\]", re.DOTALL)


def is_mcp_url(url: str) -> bool:
    """Whether ``url`` names an MCP server: HTTP(S) with a path ending in ``/mcp``."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and parts.path.rstrip("/").endswith("/mcp")


class _Connection:
    """One MCP session, held open by a task of its own: the SDK's transport is an anyio
    task group, which must be left in the task that entered it, while a rollout may start
    an episode in one task and end it in another."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float) -> None:
        self.url, self._headers, self._timeout = url, headers, timeout
        self.refused: int | None = None
        """The status of a refusal the server answered (401 or 403: the token), if any."""
        self._ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._leave = asyncio.Event()
        self._task = asyncio.create_task(self._hold())

    @classmethod
    async def open(
        cls, url: str, headers: dict[str, str], timeout: float
    ) -> tuple[_Connection, ClientSession]:
        """A connected, initialized MCP session; Unauthorized or EngineError when none opens."""
        connection = cls(url, headers, timeout)
        try:
            return connection, await connection._ready
        except BaseException as exc:
            await connection.close()
            if not isinstance(exc, Exception):  # cancelled: the session is left all the same
                raise
            if connection.refused is not None:
                raise Unauthorized(f"{url} refused the session (HTTP {connection.refused})") from None
            raise EngineError(f"cannot open an MCP session at {url}: {_innermost(exc)!r}") from None

    async def close(self) -> None:
        """Leave the session (the transport sends its DELETE) and wait until it is left."""
        self._leave.set()
        with contextlib.suppress(Exception):
            await self._task

    async def _hold(self) -> None:
        hooks = {"response": [self._note_refusal]}
        http = httpx2.AsyncClient(
            headers=self._headers, timeout=httpx2.Timeout(self._timeout), event_hooks=hooks
        )
        try:
            async with (
                http,
                streamable_http_client(self.url, http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=self._timeout) as session,
            ):
                await session.initialize()
                if not self._ready.done():  # else the opener was cancelled and leaves at once
                    self._ready.set_result(session)
                await self._leave.wait()
        except BaseException as exc:
            if self._ready.done():
                raise
            self._ready.set_exception(exc if isinstance(exc, Exception) else EngineError("cancelled"))

    async def _note_refusal(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            self.refused = response.status_code


class _McpEpisode:
    """One episode: its MCP session, and a lock so that its actions go one at a time."""

    def __init__(self, connection: _Connection, session: ClientSession) -> None:
        self.connection, self.session = connection, session
        self.lock = asyncio.Lock()


class McpEnvClient:
    """An MCP server of AgentGym's tool contract behind :class:`~agentgym.clients.env_client.AsyncEnvClient`'s
    interface (``health``, ``metadata``, ``tasks``, ``create``, ``step``, ``delete``, ``close``)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 256,
    ) -> None:
        del retry, max_connections  # one MCP session per episode; a tool call is never resent
        self.url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._control: _McpEpisode | None = None
        """The MCP session that answers env_info and list_tasks (opened on first use)."""
        self._episodes: dict[str, _McpEpisode] = {}
        self._typed: dict[str, str] | None = None
        """Action tool -> its string argument, read from the server's tool list once."""

    # ----- what the server is ----------------------------------------------------------

    async def health(self) -> Health:
        name = (await self.metadata()).name
        return Health(status="ok", env=name, sessions=len(self._episodes), capacity=0)

    async def metadata(self) -> Metadata:
        return await self._query("env_info", {}, Metadata)

    async def tasks(self, split: str | None = None, offset: int = 0, limit: int = 100) -> TaskList:
        query = {"offset": offset, "limit": limit} | ({"split": split} if split else {})
        return await self._query("list_tasks", query, TaskList)

    # ----- episodes --------------------------------------------------------------------

    async def create(
        self,
        task_id: str | None = None,
        *,
        split: str | None = None,
        index: int | None = None,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> SessionCreated:
        """Open an MCP session and start its episode (``start_episode``)."""
        choice = {"task_id": task_id, "split": split, "index": index, "seed": seed, "options": options}
        episode = _McpEpisode(*await _Connection.open(self.url, self._headers, self.timeout))
        session_id = uuid.uuid4().hex
        self._episodes[session_id] = episode
        try:
            await self._action_tools(episode)
            started = await _call(
                episode, "start_episode", {k: v for k, v in choice.items() if v is not None}
            )
        except BaseException:
            await self.delete(session_id)
            raise
        return _model(SessionCreated, started | {"session_id": session_id}, "start_episode")

    async def step(self, session_id: str, action: str) -> StepResult:
        episode = self._episode(session_id)
        tool, arguments = self._action_call(action)
        async with episode.lock:
            result = await _call(episode, tool, arguments, action=True)
        return _model(StepResult, result, tool)

    async def delete(self, session_id: str) -> None:
        """End the episode: the MCP session is deleted (the server closes its env session)."""
        episode = self._episodes.pop(session_id, None)
        if episode is None:
            raise UnknownSession(f"no session {session_id!r}")
        await episode.connection.close()

    async def close(self) -> None:
        for session_id in list(self._episodes):
            await self.delete(session_id)
        await self._close_control()

    async def __aenter__(self) -> McpEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----- internals -------------------------------------------------------------------

    async def _query(self, tool: str, arguments: dict[str, Any], model: type[BaseModel]) -> Any:
        """A session-less tool's answer as ``model``, on the control session."""

        async def ask() -> Any:
            if self._control is None:
                self._control = _McpEpisode(*await _Connection.open(self.url, self._headers, self.timeout))
            return _model(model, await _call(self._control, tool, arguments), tool)

        try:
            return await ask()
        except UnknownSession:  # it idled past the server's TTL (a client may live a whole run)
            await self._close_control()
            return await ask()

    async def _close_control(self) -> None:
        if self._control is not None:
            await self._control.connection.close()
            self._control = None

    async def _action_tools(self, episode: _McpEpisode) -> dict[str, str]:
        """The server's typed action tools (name -> argument), read once."""
        if self._typed is None:
            listed = await episode.session.list_tools()
            self._typed = {tool.name: argument for tool in listed.tools if (argument := _one_string(tool))}
        return self._typed

    def _action_call(self, action: str) -> tuple[str, dict[str, str]]:
        """(tool, arguments) that play ``action``: its verb's tool, else ``act`` (its argument
        is read from the server's schema like a typed tool's)."""
        typed = self._typed or {}
        match = _TYPED_ACTION.fullmatch(action)
        if match and match[1] in typed and match[1] != ACT_TOOL:
            return match[1], {typed[match[1]]: match[2]}
        if ACT_TOOL in typed:
            return ACT_TOOL, {typed[ACT_TOOL]: action}
        raise InvalidAction(f"{action!r} is none of the server's actions ({', '.join(sorted(typed))})")

    def _episode(self, session_id: str) -> _McpEpisode:
        episode = self._episodes.get(session_id)
        if episode is None:
            raise UnknownSession(f"no session {session_id!r} (never created or closed)")
        return episode


async def _call(
    episode: _McpEpisode, tool: str, arguments: dict[str, Any], *, action: bool = False
) -> dict[str, Any]:
    """A tool's structured result; its errors as ours (see the module docstring)."""
    try:
        result = await episode.session.call_tool(tool, arguments)
    except MCPError as exc:
        raise _protocol_error(exc) from None
    if not isinstance(result, types.CallToolResult):
        raise EngineError(f"{tool} asked for input this client cannot give")
    data = _structured(result)
    if result.is_error:
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            raise error_from_body(0, data, data.get("retry_after"))
        text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
        raise (InvalidAction if action else EngineError)(f"{tool}: {text or 'tool error'}")
    if not isinstance(data, dict):
        raise EngineError(f"{tool} answered no structured result (a JSON object)")
    return data


def _structured(result: types.CallToolResult) -> Any:
    """The structured content, else the first text block parsed as JSON (servers that only
    write text), else None."""
    if result.structured_content is not None:
        return result.structured_content
    for block in result.content:
        if isinstance(block, types.TextContent):
            with contextlib.suppress(ValueError):
                return json.loads(block.text)
    return None


def _model(model: type[BaseModel], data: dict[str, Any], tool: str) -> Any:
    try:
        return model.model_validate(data)
    except ValueError as exc:
        raise EngineError(f"{tool} answered a result outside the contract: {exc}") from None


def _one_string(tool: types.Tool) -> str | None:
    """A tool's argument when it takes exactly one, a required string."""
    properties = tool.input_schema.get("properties", {})
    required = tool.input_schema.get("required", [])
    if len(properties) == 1 and required == list(properties):
        name = required[0]
        return name if properties[name].get("type") == "string" else None
    return None


def _protocol_error(exc: MCPError) -> AgentGymError:
    """A JSON-RPC error as ours: a bad request is the caller's, a lost session is gone."""
    if exc.error.code == types.INVALID_PARAMS:
        return SchemaError(exc.error.message)
    if exc.error.code == types.INVALID_REQUEST:  # the SDK's "Session terminated": expired or deleted
        return UnknownSession(f"the MCP session is gone: {exc.error.message}")
    return EngineError(f"MCP error {exc.error.code}: {exc.error.message}")


def _innermost(exc: BaseException) -> BaseException:
    """The first leaf of nested exception groups (the SDK's task groups wrap every failure)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
