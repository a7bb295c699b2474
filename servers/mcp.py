"""MCP on every env server: ``/mcp``, the official SDK's streamable HTTP transport
(docs/mcp.md), so an assistant or an agent SDK plays the env through tools.

* **Tools.** ``env_info``, ``list_tasks``, ``start_episode``, ``act``, ``observe`` and
  ``end_episode``; an env whose ``action_format`` names typed actions (``search[query]``,
  ``click[element]``) gets one tool per action type besides (``search(query)``, ...).
  Inputs are checked against each tool's schema and the env's input rules before any
  engine sees them; a bad one is a tool error (``isError``) naming the problem. No tool
  is named like OpenEnv's reserved ``reset``, ``step``, ``state`` and ``close``.
* **Sessions.** An MCP session (the ``Mcp-Session-Id`` of the initialize handshake) holds
  at most one env session, opened by ``start_episode`` from the server's
  :class:`~agentgym.servers.sessions.SessionManager` (capacity, quotas, the idle TTL,
  metrics and engine workers apply as on every route). No tool takes a session id, and
  the env session is owned by its MCP session (:attr:`Session.owner`), so neither another
  MCP session nor a v1, AgentGym or OpenEnv route reaches it. It closes with
  ``end_episode``, when its MCP session is deleted, or after the server's idle TTL; the
  MCP session itself ends after the same idle time, or after the much shorter bare
  timeout (``--mcp-ttl``) while it holds no episode (:mod:`agentgym.servers.mcp_admission`).
* **Only request-response.** There are no server-initiated messages, so ``GET`` (the
  optional stream for them) is 405, as the spec allows: every exchange is a POST that
  ends, which the gateway relays like any request and which never holds a server's
  shutdown. Sessions exist only in the handshake era (protocol versions up to
  2025-11-25): a request of the 2026 per-request era is refused with -32022 naming the
  handshake versions, so a client in ``auto`` mode (the SDK's ``Client``) falls back to
  the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field, StrictStr, create_model
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agentgym.contract.core import TextEnv
from agentgym.contract.errors import AgentGymError, EpisodeOver, UnknownSession
from agentgym.servers.episodes import play_step, reset_kwargs, start_session, task_page
from agentgym.servers.mcp_admission import (
    MCP_PATH,
    SESSION_HEADER,
    McpAdmission,
    answered,
    delete_session,
    invalid_id,
    unserved,
    whole_body,
)
from agentgym.servers.metrics import ServerMetrics
from agentgym.servers.middleware import ClientOf
from agentgym.servers.openenv import parse_model
from agentgym.servers.sessions import Session, SessionManager
from agentgym.wire import CreateSessionRequest

log = logging.getLogger(__name__)

MCP_SESSIONS_PER_SLOT = 4
"""MCP sessions open at once, per session the server takes (and per session of a client's
quota); beyond, 429 with Retry-After (:mod:`agentgym.servers.mcp_admission`). One costs no engine
until it starts an episode (a client also keeps one for env_info and list_tasks), and idle
ones expire (those without an episode after the bare timeout), so this only bounds their memory."""
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})
"""OpenEnv's orchestration controls (openenv-core's ``RESERVED_TOOL_NAMES``): no tool here
takes one of them, so an OpenEnv harness can list our tools beside its own."""
FIXED_TOOL_NAMES = frozenset({"env_info", "list_tasks", "start_episode", "act", "observe", "end_episode"})
_ACTION_TYPE = re.compile(r"\b([a-z][a-z_]*)\[([a-z][a-z_]*)\]")
"""A typed action in an ``action_format``: ``verb[argument]`` with a placeholder name
(``click[buy now]``, an example, has a space and is not one)."""


# ----- the tools' inputs ---------------------------------------------------------------------


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoArguments(_Arguments):
    pass


class TaskQuery(_Arguments):
    split: str | None = Field(
        default=None, description="One split (train, validation, test); all when left out"
    )
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=100, ge=1, le=10_000)


class Act(_Arguments):
    action: StrictStr = Field(description="The action, in the env's action format")


@dataclass(frozen=True)
class TypedAction:
    """A typed action of an env (``search[query]``): played by the tool ``verb``."""

    verb: str
    argument: str

    def action(self, value: str) -> str:
        return f"{self.verb}[{value}]"


def action_types(action_format: str) -> list[TypedAction]:
    """The typed actions an ``action_format`` names, first spelling of each verb; none
    whose verb is taken by a fixed or reserved tool name (``act`` plays those)."""
    types_by_verb: dict[str, TypedAction] = {}
    for verb, argument in _ACTION_TYPE.findall(action_format):
        if verb not in FIXED_TOOL_NAMES | RESERVED_TOOL_NAMES:
            types_by_verb.setdefault(verb, TypedAction(verb, argument))
    return list(types_by_verb.values())


def _typed_arguments(kind: TypedAction, max_chars: int) -> type[BaseModel]:
    """The input model of a typed action's tool: its one string argument."""
    limit = max(1, max_chars - len(kind.verb) - 2)  # a schema hint: the env's rules decide
    argument = Field(description=f"The text inside {kind.verb}[...]", json_schema_extra={"maxLength": limit})
    return create_model(kind.verb, __base__=_Arguments, **{kind.argument: (StrictStr, argument)})


# ----- the tools -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """Who called a tool: its MCP session's id (None outside one) and the HTTP request's scope."""

    mcp_session: str | None
    scope: Scope

    @property
    def key(self) -> str:
        """The MCP session's id; UnknownSession outside one."""
        if self.mcp_session is None:
            raise UnknownSession(
                "this tool needs an MCP session: connect with the initialize handshake "
                f"(protocol {HANDSHAKE_PROTOCOL_VERSIONS[-1]} or older)"
            )
        return self.mcp_session

    @property
    def owner(self) -> str:
        """The owner of the env sessions it opens (:attr:`Session.owner`)."""
        return f"mcp {self.key}"


Run = Callable[[Caller, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    arguments: type[BaseModel]
    run: Run
    episode: bool = False
    """Its result is an episode's observation (rendered as text for the model to read)."""

    def listing(self) -> types.Tool:
        return types.Tool(
            name=self.name, description=self.description, input_schema=self.arguments.model_json_schema()
        )


@dataclass
class _Held:
    """What one MCP session holds: its env session, and a lock so that its starts and ends
    do not interleave (two concurrent starts must not open two env sessions)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    env: Session | None = None

    @property
    def live(self) -> Session | None:
        return self.env if self.env is not None and not self.env.closed else None


class EnvTools:
    """The env's tools and the env sessions of the MCP sessions that call them."""

    def __init__(
        self, catalog: TextEnv, sessions: SessionManager, metrics: ServerMetrics, client_of: ClientOf
    ) -> None:
        self.catalog, self.sessions, self.metrics, self.client_of = catalog, sessions, metrics, client_of
        self._held: dict[str, _Held] = {}
        self.tools = {tool.name: tool for tool in self._tools()}

    def _tools(self) -> list[McpTool]:
        form = self.catalog.action_format
        return [
            McpTool(
                "env_info",
                "What the env is: instruction for agents, action format, splits, turn limit.",
                NoArguments,
                self._env_info,
            ),
            McpTool(
                "list_tasks", "The env's fixed tasks, one split or all, paged.", TaskQuery, self._list_tasks
            ),
            McpTool(
                "start_episode",
                "Start an episode on task_id, or on task `index` of `split`, or on a task of "
                "`split` (default train) drawn with `seed`; returns the first observation, which states the "
                "goal. Starting again replaces the running episode.",
                CreateSessionRequest,
                self._start,
                episode=True,
            ),
            McpTool(
                "act", f"Play one action, in the env's action format: {form}.", Act, self._act, episode=True
            ),
            *self._typed_tools(),
            McpTool(
                "observe",
                "The running episode: last observation, turn, score, done, available actions.",
                NoArguments,
                self._observe,
                episode=True,
            ),
            McpTool(
                "end_episode", "End the running episode and free its engine.", NoArguments, self._end_episode
            ),
        ]

    def _typed_tools(self) -> list[McpTool]:
        """One tool per typed action of the env's action format (none for free text)."""
        max_chars = self.catalog.action_rules.max_chars
        return [
            McpTool(
                kind.verb,
                f"Play the action {kind.verb}[<{kind.argument}>].",
                _typed_arguments(kind, max_chars),
                self._typed(kind),
                episode=True,
            )
            for kind in action_types(self.catalog.action_format)
        ]

    async def call(
        self, name: str, arguments: dict[str, Any] | None, request: Request | None
    ) -> types.CallToolResult:
        """Run tool ``name``; an unknown name is a protocol error (the spec's), anything the
        caller can fix a tool error naming it, and a bug a tool error too (logged)."""
        tool = self.tools.get(name)
        if tool is None:
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"unknown tool {name!r}; tools: {', '.join(self.tools)}"
            )
        caller = Caller(
            request.headers.get(SESSION_HEADER) if request else None, request.scope if request else {}
        )
        try:
            result = await tool.run(caller, parse_model(tool.arguments, arguments or {}))
        except AgentGymError as exc:
            return tool_error(exc)
        except Exception as exc:
            log.exception("MCP tool %s failed", name)
            return tool_error(AgentGymError(f"internal error: {exc}"))
        text = episode_text(result) if tool.episode else json.dumps(result, indent=1)
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=result)

    def holds_episode(self, session_key: str) -> bool:
        """Whether MCP session ``session_key`` holds a live env session."""
        held = self._held.get(session_key)
        return held is not None and held.live is not None

    async def end(self, session_key: str) -> bool:
        """Close the env session of MCP session ``session_key``; whether one was running."""
        held = self._held.get(session_key)
        if held is None:
            return False
        async with held.lock:
            session = held.live
            if session is None:
                return False
            with contextlib.suppress(UnknownSession):  # expired or failed meanwhile
                await self.sessions.close(session.session_id, session.owner)
            return True

    # ----- what each tool does -----------------------------------------------------------

    async def _env_info(self, caller: Caller, _: NoArguments) -> dict[str, Any]:
        return self.catalog.metadata()

    async def _list_tasks(self, caller: Caller, query: TaskQuery) -> dict[str, Any]:
        return task_page(self.catalog, query.split, query.offset, query.limit)

    async def _start(self, caller: Caller, body: CreateSessionRequest) -> dict[str, Any]:
        kwargs = reset_kwargs(self.catalog, body)  # bad options are refused before an engine is built
        held = self._hold(caller)
        async with held.lock:
            session = held.live
            if session is None:
                owner, client = caller.owner, self.client_of(caller.scope)
                held.env, observation, info = await start_session(
                    self.sessions, kwargs, client=client, owner=owner
                )
            else:
                observation, info = await self.sessions.call(
                    session, "reset", deadline=self.sessions.reset_deadline, **kwargs
                )
        return {"observation": observation, "info": info}

    async def _act(self, caller: Caller, arguments: Act) -> dict[str, Any]:
        checked = self.catalog.validate_action(arguments.action)
        try:
            return await play_step(self.sessions, self.metrics, self._episode(caller), checked)
        except EpisodeOver as exc:  # the env's message names REST's reset; here it is a tool
            raise EpisodeOver("the episode is over; call start_episode to play another") from exc

    def _typed(self, kind: TypedAction) -> Run:
        async def play(caller: Caller, arguments: BaseModel) -> dict[str, Any]:
            return await self._act(caller, Act(action=kind.action(getattr(arguments, kind.argument))))

        return play

    async def _observe(self, caller: Caller, _: NoArguments) -> dict[str, Any]:
        state = self._episode(caller).state()
        del state["session_id"]  # the MCP session is the handle; the env session's id stays inside
        return state

    async def _end_episode(self, caller: Caller, _: NoArguments) -> dict[str, Any]:
        return {"ended": await self.end(caller.key)}

    # ----- the MCP sessions' env sessions ------------------------------------------------

    def _episode(self, caller: Caller) -> Session:
        held = self._held.get(caller.key)
        session = held.live if held else None
        if session is None:
            raise UnknownSession(
                "no episode is running in this MCP session: call start_episode (an episode ends "
                "with end_episode, after the server's idle TTL, or when its engine fails)"
            )
        return session

    def _hold(self, caller: Caller) -> _Held:
        """The caller's entry, made on its first start; entries whose env session is gone
        and that no call holds are dropped then, so MCP sessions that end without a DELETE
        (their env sessions expire) leave nothing behind."""
        key = caller.key
        if key not in self._held:
            for stale in [k for k, h in self._held.items() if h.live is None and not h.lock.locked()]:
                del self._held[stale]
            self._held[key] = _Held()
        return self._held[key]


def tool_error(exc: AgentGymError) -> types.CallToolResult:
    """A tool error: ``code: message`` for the model, our error body for programs."""
    body = exc.to_body() | ({"retry_after": exc.retry_after} if exc.retry_after else {})
    return types.CallToolResult(
        content=[types.TextContent(text=f"{exc.code}: {exc.message}")], structured_content=body, is_error=True
    )


def episode_text(result: dict[str, Any]) -> str:
    """An observation as a model reads it: the text, then turn, score, reward, the end, and
    the valid actions where the env lists them (never the expert's action)."""
    info = result.get("info", {})
    status = [f"turn {info.get('turn', 0)}", f"score {float(info.get('score', 0.0)):g}"]
    if "reward" in result:
        status.append(f"reward {result['reward']:+g}")
    if result.get("terminated") or result.get("truncated") or result.get("done"):
        status.append("episode over: " + ("success" if info.get("success") else "no success"))
    text = f"{result['observation']}\n\n[{', '.join(status)}]"
    actions = info.get("available_actions")
    return text + ("\nAvailable actions: " + " | ".join(actions) if actions else "")


# ----- the endpoint ----------------------------------------------------------------------------


class McpEndpoint:
    """``/mcp``: the SDK's session manager behind two refusals (``GET``, and the 2026
    per-request era: see the module docstring); a session the client deletes closes its
    env session at once."""

    def __init__(
        self, tools: EnvTools, manager: StreamableHTTPSessionManager, admission: McpAdmission
    ) -> None:
        self.tools, self.manager, self.admission = tools, manager, admission

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The manager's task group, for the server's lifespan."""
        async with self.manager.run():
            yield

    def route(self) -> Route:
        """The endpoint as a route of the server's app, at :data:`MCP_PATH`."""
        return _NamedRoute(MCP_PATH, self, include_in_schema=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._release_lapsed()
        refusal = unserved(scope)
        if refusal is None and scope["method"] == "POST":  # ids checked, and openings admitted, first
            body, receive = await whole_body(scope, receive)
            refusal = invalid_id(body)
        key = Request(scope).headers.get(SESSION_HEADER)
        client = self.tools.client_of(scope)
        if refusal is None and scope["method"] == "POST" and key is None:
            refusal = self.admission.refusal(client)
        if refusal is not None:
            await refusal(scope, receive, send)
        elif key is None:
            status, opened = await answered(self.manager.handle_request, scope, receive, send)
            if opened and status is not None and status < 300:
                self.admission.opened(opened, client)
        else:
            await self._serve(key, scope, receive, send)

    async def _serve(self, key: str, scope: Scope, receive: Receive, send: Send) -> None:
        """A request of session ``key``: the session does not idle while it runs, and its
        idle timeout after depends on whether it then holds an episode."""
        self.admission.begin(key)
        try:
            status, _ = await answered(self.manager.handle_request, scope, receive, send)
        finally:
            self.admission.end(key, self.tools.holds_episode(key))
        if scope["method"] == "DELETE" and status is not None and status < 300:
            self.admission.closed(key)
            await self.tools.end(key)

    async def _release_lapsed(self) -> None:
        """End the sessions admission found lapsed, as their clients' DELETE would: a bare one
        would otherwise stay open in the SDK (and count against its limit) for the full TTL.
        Checked on every request, so a lapsed session answers 404 from then on."""
        for key in self.admission.lapsed():
            await self.tools.end(key)
            await delete_session(self.manager.handle_request, key)


class _NamedRoute(Route):
    """A route that names itself in the scope as FastAPI's own routes do: the server's
    request metrics are labelled by it (else ``unmatched``)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self
        await super().handle(scope, receive, send)


def mcp_endpoint(
    catalog: TextEnv,
    sessions: SessionManager,
    metrics: ServerMetrics,
    client_of: ClientOf,
    *,
    max_body_bytes: int,
    bare_ttl: float,
) -> McpEndpoint:
    """The ``/mcp`` endpoint of an env server: its env sessions are the server's; its MCP
    sessions expire after the same idle time (``bare_ttl`` while they hold no episode), at
    most :data:`MCP_SESSIONS_PER_SLOT` per slot."""
    tools = EnvTools(catalog, sessions, metrics, client_of)

    async def list_tools(
        _: ServerRequestContext, __: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.listing() for tool in tools.tools.values()])

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await tools.call(params.name, params.arguments, ctx.request)

    server = Server(
        catalog.name,
        version=catalog.version,
        description=catalog.description,
        instructions=catalog.instruction(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    capacity = MCP_SESSIONS_PER_SLOT * sessions.max_sessions
    manager = StreamableHTTPSessionManager(
        server,
        json_response=True,  # one JSON answer per POST: nothing streams
        session_idle_timeout=sessions.ttl,  # bare sessions are ended sooner, by the endpoint
        max_request_body_size=max_body_bytes,
        max_sessions=capacity,
    )
    per_client = None if sessions.max_per_client is None else MCP_SESSIONS_PER_SLOT * sessions.max_per_client
    admission = McpAdmission(capacity, per_client, sessions.ttl, bare_ttl)
    return McpEndpoint(tools, manager, admission)
