"""Any OpenEnv environment as an AgentGym env server: :class:`OpenEnvClient` has the
async interface of :class:`agentgym.clients.env_client.AsyncEnvClient` that rollouts, ``eval`` and
``train`` use, and plays each episode over one OpenEnv WebSocket session (``/ws``).

A WebSocket URL (``ws://`` or ``wss://``) names an OpenEnv server everywhere an env URL is
taken (``agentgym eval --url ws://host:port``, ``train --set env_url=ws://host:port``);
:func:`env_client` picks the client by it. The mapping (docs/openenv.md):

* **Tasks.** OpenEnv has no task lists; task ``<split>/seed-<n>`` resets with ``seed=n``.
  Each split has :data:`TASKS_PER_SPLIT` seeds: train from 0, validation from
  :data:`VALIDATION_SEED_BASE`, test from :data:`TEST_SEED_BASE`.
* **Actions.** The reply text goes into the action's one string field (read from
  ``/schema``: the only required string field, else the only string field), or
  ``action_key``.
* **Observations.** The observation's one string field (or ``observation_key``) is the
  text the agent sees; with none, the observation as JSON. Its other fields go into
  ``info`` (an ``info`` object is merged in: AgentGym servers put v1's info there).
* **Tool-calling envs** (OpenEnv's ``MCPEnvironment``, whose action is a ``CallToolAction``):
  replies become tool calls, results the text (:mod:`agentgym.clients.openenv_tools`).
* **Rewards and outcome.** Rewards pass through; ``score`` is the env's, else the episode's
  reward so far; ``success`` is the env's, else an episode that ended (``done``) with a
  positive score. ``done`` is ``terminated`` unless the env says ``truncated``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as websocket_connect
from websockets.exceptions import InvalidStatus, WebSocketException

from agentgym.clients.env_client import AsyncEnvClient, RetryPolicy
from agentgym.clients.mcp_client import McpEnvClient, is_mcp_url
from agentgym.clients.openenv_tools import is_tool_action, tool_call, tool_result_text, tool_signatures
from agentgym.contract.core import resolve_split
from agentgym.contract.errors import (
    AgentGymError,
    AtCapacity,
    EngineError,
    InvalidAction,
    Unauthorized,
    UnknownSession,
    UnknownTask,
    error_from_body,
)
from agentgym.wire import Health, Metadata, SessionCreated, StepResult, TaskInfo, TaskList

TASKS_PER_SPLIT = 100
TEST_SEED_BASE = 10_000
VALIDATION_SEED_BASE = 5_000
SPLIT_SEED_BASES = {"train": 0, "test": TEST_SEED_BASE, "validation": VALIDATION_SEED_BASE}
"""Listed in this order (validation came last, so the split-after-split numbering stays)."""
DEFAULT_MAX_TURNS = 30
_TASK_ID = re.compile(r"(?P<split>[a-z]+)/seed-(?P<seed>\d+)")

WS_ERRORS: dict[str, type[AgentGymError]] = {
    "CAPACITY_REACHED": AtCapacity,
    "VALIDATION_ERROR": InvalidAction,  # the rollout counts a refused action as a spent turn
    "SESSION_ERROR": UnknownSession,
}
"""OpenEnv's error codes as our errors (any other: the env failed, EngineError)."""


def is_openenv_url(url: str) -> bool:
    """Whether ``url`` names an OpenEnv server (a WebSocket URL)."""
    return url.startswith(("ws://", "wss://"))


def env_client(url: str, **kwargs: Any) -> AnyEnvClient:
    """The async client for the env server at ``url``: OpenEnv's protocol for a WebSocket
    URL, MCP for an HTTP URL whose path ends in ``/mcp`` (docs/mcp.md), wire API v1
    otherwise (same methods, same keyword arguments)."""
    if is_openenv_url(url):
        return OpenEnvClient(url, **kwargs)
    return McpEnvClient(url, **kwargs) if is_mcp_url(url) else AsyncEnvClient(url, **kwargs)


def openenv_task_ids(split: str, count: int = TASKS_PER_SPLIT) -> list[str]:
    """The task ids of ``split`` of any OpenEnv env (seeds; see the module docstring)."""
    split = resolve_split(split, SPLIT_SEED_BASES)
    if split not in SPLIT_SEED_BASES:
        raise UnknownTask(f"an OpenEnv env has splits {sorted(SPLIT_SEED_BASES)}, not {split!r}")
    return [f"{split}/seed-{SPLIT_SEED_BASES[split] + i}" for i in range(count)]


@dataclass
class _OpenEnvEpisode:
    """One OpenEnv session: its connection and the running totals our info needs."""

    connection: ClientConnection
    task_id: str
    turn: int = 0
    total_reward: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class OpenEnvClient:
    """An OpenEnv server behind :class:`~agentgym.clients.env_client.AsyncEnvClient`'s interface
    (``health``, ``metadata``, ``tasks``, ``create``, ``step``, ``delete``, ``close``)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        max_connections: int = 256,
        max_turns: int = DEFAULT_MAX_TURNS,
        action_key: str | None = None,
        observation_key: str | None = None,
    ) -> None:
        del retry, max_connections  # one connection per episode; an episode is never resent
        self.ws_url = base_url.rstrip("/")
        self.http_url = "http" + self.ws_url.removeprefix("ws")
        self.max_turns = max_turns
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.http_url, timeout=timeout, headers=self._headers)
        self._keys: tuple[str, str | None] | None = (action_key, observation_key) if action_key else None
        self._observation_key = observation_key
        self._episodes: dict[str, _OpenEnvEpisode] = {}
        self._tool_mode = False
        """The env's actions are tool calls (set from ``/schema``)."""
        self._tools: dict[str, list[str]] | None = None

    # ----- what the server is ----------------------------------------------------------

    async def health(self) -> Health:
        status = (await self._get("/health")).get("status", "unknown")
        return Health(
            status=status, env=(await self.metadata()).name, sessions=len(self._episodes), capacity=0
        )

    async def metadata(self) -> Metadata:
        about = await self._get("/metadata")
        action_key, _ = await self._schema_keys()
        return Metadata(
            name=str(about.get("name") or "openenv"),
            version=str(about.get("version") or "unknown"),
            description=str(about.get("description") or ""),
            instruction=str(about.get("readme_content") or about.get("description") or ""),
            action_format="a tool call: verb[text], a tool's name, or text for tool 'act'"
            if self._tool_mode
            else f"the action's {action_key!r} field, as text",
            splits={split: TASKS_PER_SPLIT for split in SPLIT_SEED_BASES},
            max_turns=self.max_turns,
            reward_range=[0.0, 1.0],
        )

    async def tasks(self, split: str | None = None, offset: int = 0, limit: int = 100) -> TaskList:
        splits = [resolve_split(split, SPLIT_SEED_BASES)] if split else list(SPLIT_SEED_BASES)
        chosen = [TaskInfo(task_id=t, split=s) for s in splits for t in openenv_task_ids(s)]
        return TaskList(tasks=chosen[offset : offset + limit], total=len(chosen))

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
        """Open a session and reset it on ``task_id`` (or task ``index`` of ``split``, or
        ``seed``). ``options`` are AgentGym's (an OpenEnv env takes none): the rollout
        enforces its own turn limit."""
        task_id = task_id or (openenv_task_ids(split or "train")[index] if index is not None else None)
        reset = {"seed": _seed_of(task_id)} if task_id else ({"seed": seed} if seed is not None else {})
        await self._schema_keys()  # before a session is held
        connection = await self._connect()
        episode = _OpenEnvEpisode(connection, task_id or f"seed-{reset.get('seed')}")
        session_id = uuid.uuid4().hex
        self._episodes[session_id] = episode
        try:
            reply = await self._exchange(episode, {"type": "reset", "data": reset})
        except BaseException:
            await self.delete(session_id)
            raise
        observation, info, _ = self._read(episode, reply)
        return SessionCreated(session_id=session_id, observation=observation, info=info)

    async def step(self, session_id: str, action: str) -> StepResult:
        episode = self._episode(session_id)
        action_key, _ = await self._schema_keys()
        async with episode.lock:
            data = (
                tool_call(action, await self._tool_list(episode)) if self._tool_mode else {action_key: action}
            )
            reply = await self._exchange(episode, {"type": "step", "data": data})
            episode.turn += 1
            reward = float(reply.get("reward") or 0.0)
            episode.total_reward += reward
            observation, info, (terminated, truncated) = self._read(episode, reply)
        return StepResult(
            observation=observation, reward=reward, terminated=terminated, truncated=truncated, info=info
        )

    async def delete(self, session_id: str) -> None:
        """End the session: OpenEnv's ``close`` message, then the connection."""
        episode = self._episodes.pop(session_id, None)
        if episode is None:
            raise UnknownSession(f"no session {session_id!r}")
        with contextlib.suppress(WebSocketException):  # the server closed it already
            await episode.connection.send(json.dumps({"type": "close"}))
        await episode.connection.close()

    async def close(self) -> None:
        for session_id in list(self._episodes):
            await self.delete(session_id)
        await self._http.aclose()

    async def __aenter__(self) -> OpenEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----- internals -------------------------------------------------------------------

    async def _get(self, path: str) -> dict[str, Any]:
        response = await self._http.get(path)
        if response.status_code >= 400:
            raise error_from_body(response.status_code, _json_or_text(response))
        body = response.json()
        if not isinstance(body, dict):
            raise EngineError(f"{self.http_url}{path} answered {body!r}, not a JSON object")
        return body

    async def _schema_keys(self) -> tuple[str, str | None]:
        """(action field, observation text field): given, or read once from ``/schema``
        (servers that host OpenEnv under ``/openenv``, like ours, answer there)."""
        if self._keys is None:
            try:
                schema = await self._get("/schema")
            except AgentGymError:
                schema = await self._get("/openenv/schema")
            self._tool_mode = is_tool_action(schema.get("action", {}))
            action_key = (
                "tool_name" if self._tool_mode else _text_field(schema.get("action", {}), required_only=True)
            )
            if action_key is None:
                raise AgentGymError(
                    f"cannot tell which field of {self.http_url}'s action carries the text; name it (action_key)"
                )
            self._keys = (action_key, self._observation_key or _text_field(schema.get("observation", {})))
        return self._keys

    async def _tool_list(self, episode: _OpenEnvEpisode) -> dict[str, list[str]]:
        """The env's tools and their required arguments, listed once (over ``episode``)."""
        if self._tools is None:
            reply = await self._exchange(episode, {"type": "step", "data": {"type": "list_tools"}})
            self._tools = tool_signatures(reply.get("observation") or {})
        return self._tools

    async def _connect(self) -> ClientConnection:
        try:
            return await websocket_connect(
                f"{self.ws_url}/ws",
                additional_headers=self._headers,
                open_timeout=self.timeout,
                max_size=None,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            error = Unauthorized if status in (401, 403) else EngineError
            raise error(f"{self.ws_url}/ws refused the session (HTTP {status})") from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise EngineError(f"cannot reach the OpenEnv server at {self.ws_url}: {exc}") from None

    async def _exchange(self, episode: _OpenEnvEpisode, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message, read its reply's ``data``; an error reply raises."""
        try:
            await episode.connection.send(json.dumps(message))
            async with asyncio.timeout(self.timeout):
                reply = json.loads(await episode.connection.recv())
        except WebSocketException as exc:  # closed on us: capacity, TTL, a crash; the reason says
            code = "CAPACITY_REACHED" if "CAPACITY_REACHED" in str(exc) else "SESSION_ERROR"
            raise _error_of({"code": code}, str(exc)) from None
        if reply.get("type") == "error":
            data = reply.get("data", {})
            raise _error_of(data, str(data.get("message", "error")))
        return reply.get("data", {})

    def _read(
        self, episode: _OpenEnvEpisode, reply: dict[str, Any]
    ) -> tuple[str, dict[str, Any], tuple[bool, bool]]:
        """(observation text, info, (terminated, truncated)) of a reply's data."""
        fields = dict(reply.get("observation") or {})
        text = self._observation_text(fields)
        done = bool(reply.get("done"))
        nested, meta = fields.pop("info", None), fields.pop("metadata", None)
        info = (
            fields | (meta if isinstance(meta, dict) else {}) | (nested if isinstance(nested, dict) else {})
        )
        truncated = bool(info.get("truncated")) and done
        score = float(info.get("score", episode.total_reward))
        info |= {
            "task_id": episode.task_id,
            "turn": episode.turn,
            "score": score,
            "success": bool(info.get("success", done and score > 0)),
        }
        return str(text), info, (done and not truncated, truncated)

    def _observation_text(self, fields: dict[str, Any]) -> str:
        """The text the agent sees, popped from an observation's ``fields``: a tool's result;
        the schema's text field; a tool-calling env's one string field besides v1's
        ``expert_action`` (its reset's observation is its own class); else the whole
        observation as JSON."""
        _, text_key = self._keys or (None, None)
        if self._tool_mode and "tool_name" in fields:
            return tool_result_text(fields)
        if text_key in fields and not self._tool_mode:
            return str(fields.pop(text_key))
        strings = [key for key, value in fields.items() if isinstance(value, str) and key != "expert_action"]
        if self._tool_mode and len(strings) == 1:
            return fields.pop(strings[0])
        return json.dumps(fields, sort_keys=True)

    def _episode(self, session_id: str) -> _OpenEnvEpisode:
        episode = self._episodes.get(session_id)
        if episode is None:
            raise UnknownSession(f"no session {session_id!r} (never created or closed)")
        return episode


def _seed_of(task_id: str) -> int:
    match = _TASK_ID.fullmatch(task_id)
    if match is None or match["split"] not in SPLIT_SEED_BASES:
        raise UnknownTask(f"an OpenEnv task id is '<train|validation|test>/seed-<n>', not {task_id!r}")
    return int(match["seed"])


def _text_field(schema: dict[str, Any], *, required_only: bool = False) -> str | None:
    """The one string property of a JSON schema (of the required ones, if asked), else None."""
    properties = schema.get("properties", {})
    names = [n for n, p in properties.items() if p.get("type") == "string"]
    required = [n for n in names if n in schema.get("required", [])]
    for candidates in (required, [] if required_only else names):
        if len(candidates) == 1:
            return candidates[0]
    return None


def _error_of(data: dict[str, Any], message: str) -> AgentGymError:
    """Our exception for an OpenEnv error reply (AgentGym servers also send our own code)."""
    if isinstance(data.get("error"), dict):
        return error_from_body(0, data)
    return WS_ERRORS.get(str(data.get("code")), EngineError)(message)


def _json_or_text(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return response.text


AnyEnvClient = AsyncEnvClient | OpenEnvClient | McpEnvClient
"""The async env clients: one interface (``health``, ``metadata``, ``tasks``, ``create``,
``step``, ``delete``, ``close``), three protocols."""
