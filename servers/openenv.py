"""OpenEnv's protocol on every env server, beside wire API v1 and the AgentGym routes.

OpenEnv (``openenv-core`` on PyPI) is the env layer TRL, SkyRL, ART and verifiers
consume; its ``GenericEnvClient`` talks to ``/ws``. Its published types
(``openenv.core.env_server.types``) are the spec this module follows, without importing
it (the server does not depend on openenv-core; the tests play with its real client):

* ``/ws``: one env session per connection, opened on connect (429 rules: a full server
  answers one ``CAPACITY_REACHED`` error and closes), closed on ``close`` or disconnect,
  expired by the idle TTL like any session. Client messages ``{"type": "reset"|"step"|
  "state"|"close", "data": {...}}``; replies ``{"type": "observation"|"state"|"error",
  "data": {...}}``.
* ``/openenv/{health,metadata,schema,reset,step,state}``: OpenEnv's HTTP shapes under a
  prefix, because the root ``/reset`` and ``/step`` are AgentGym's. OpenEnv's own HTTP
  reset/step are stateless (a fresh env per request), which no multi-turn env can use;
  here ``/openenv/reset`` opens a session and names it in ``observation.session_id``, and
  ``/openenv/step`` and ``/openenv/state`` take that ``session_id``.

An action is ``{"action": "<text>"}``; an observation is ``{"text", "info", "terminated",
"truncated"}`` (and, over HTTP, ``session_id``) with OpenEnv's ``reward`` and ``done``
beside it (``info`` is v1's: task_id, turn, score, success, available_actions, expert_action).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from fastapi import APIRouter, Query, Request, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from agentgym.contract.core import TextEnv
from agentgym.contract.errors import (
    AgentGymError,
    AtCapacity,
    InvalidAction,
    InvalidPayload,
    PayloadTooLarge,
    SchemaError,
    UnknownSession,
)
from agentgym.servers.episodes import play_step, reset_kwargs
from agentgym.servers.metrics import ServerMetrics
from agentgym.servers.middleware import ClientOf
from agentgym.servers.sessions import Session, SessionManager
from agentgym.wire import ResetRequest

OPENENV_PREFIX = "/openenv"


# ----- OpenEnv's types, for text environments ------------------------------------------


class TextAction(BaseModel):
    """OpenEnv's ``Action`` for a text environment: the command, plus OpenEnv's metadata."""

    model_config = ConfigDict(extra="forbid")
    action: StrictStr = Field(description="The command, as v1's step takes it")
    metadata: dict[str, Any] = Field(default_factory=dict)


class TextObservation(BaseModel):
    """OpenEnv's ``Observation``; ``reward``, ``done`` and ``metadata`` travel beside the
    other fields on the wire, as OpenEnv serializes them."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="What the agent sees")
    info: dict[str, Any] = Field(description="v1's info: task_id, turn, score, success, ...")
    terminated: bool = Field(description="The task ended (won or lost)")
    truncated: bool = Field(description="The turn limit ended the episode")
    session_id: str | None = Field(
        default=None, description="HTTP only: the session to name in /openenv/step and /openenv/state"
    )
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class TextState(BaseModel):
    """OpenEnv's ``State`` (extra fields allowed): ``episode_id`` is the session id,
    ``step_count`` the turn; the rest is v1's ``GET /sessions/{id}``."""

    model_config = ConfigDict(extra="allow")
    episode_id: str | None = None
    step_count: int = 0


class OpenEnvReset(BaseModel):
    """OpenEnv's reset parameters (``seed``, ``episode_id``) and v1's task choice."""

    model_config = ConfigDict(extra="forbid")
    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)
    task_id: str | None = None
    split: str | None = None
    index: int | None = Field(default=None, ge=0)
    options: dict[str, Any] | None = None

    def v1(self) -> ResetRequest:
        return ResetRequest(**self.model_dump(exclude={"episode_id", "session_id"}))


class HttpReset(OpenEnvReset):
    session_id: str | None = Field(default=None, description="Reset this session instead of opening one")


class HttpStep(BaseModel):
    """OpenEnv's ``StepRequest`` with the session it steps."""

    model_config = ConfigDict(extra="forbid")
    action: dict[str, Any]
    session_id: str
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


class UnknownMessageType(SchemaError):
    """A WebSocket message whose ``type`` is none of reset, step, state, close."""


WS_ERROR_CODES: dict[type[AgentGymError], str] = {
    InvalidPayload: "INVALID_JSON",
    UnknownMessageType: "UNKNOWN_TYPE",
    AtCapacity: "CAPACITY_REACHED",
    UnknownSession: "SESSION_ERROR",
    SchemaError: "VALIDATION_ERROR",
    InvalidAction: "VALIDATION_ERROR",
    PayloadTooLarge: "VALIDATION_ERROR",
}
"""Our errors as OpenEnv's ``WSErrorCode``; the rest (an unknown task, an episode over, an
engine failure) are ``EXECUTION_ERROR``. Replies carry our own code too, under ``error``."""


def ws_error(exc: AgentGymError) -> dict[str, Any]:
    """OpenEnv's error reply: ``{"type": "error", "data": {"message", "code", "error"}}``."""
    code = WS_ERROR_CODES.get(type(exc), "EXECUTION_ERROR")
    return {"type": "error", "data": {"message": exc.message, "code": code} | exc.to_body()}


async def refuse_session(websocket: WebSocket, exc: AgentGymError) -> None:
    """Answer an accepted connection that gets no session as OpenEnv's server does (one
    error reply, then close), the close frame naming the reason too: OpenEnv's client
    sends its first message after that close and reports only the close frame."""
    await websocket.send_json(ws_error(exc))
    code = 1013 if isinstance(exc, AtCapacity) else 1011  # RFC 6455: try again later / server error
    reason = f"{ws_error(exc)['data']['code']}: {exc.message}"
    await websocket.close(code=code, reason=reason.encode()[:120].decode(errors="ignore"))


# ----- the routes -------------------------------------------------------------------------


class OpenEnvProtocol:
    """The episode operations both transports share, on our sessions and their rules."""

    def __init__(
        self, catalog: TextEnv, sessions: SessionManager, metrics: ServerMetrics, client_of: ClientOf
    ) -> None:
        self.catalog, self.sessions, self.metrics, self.client_of = catalog, sessions, metrics, client_of

    def reset_kwargs(self, request: OpenEnvReset) -> dict[str, Any]:
        """``TextEnv.reset``'s arguments, the options checked (SchemaError, 422)."""
        return reset_kwargs(self.catalog, request.v1())

    async def reset(self, session: Session, kwargs: dict[str, Any]) -> dict[str, Any]:
        observation, info = await self.sessions.call(
            session, "reset", deadline=self.sessions.reset_deadline, **kwargs
        )
        return _observation(observation, 0.0, False, False, info) | {"reward": None}

    async def step(self, session: Session, action: dict[str, Any]) -> dict[str, Any]:
        command = self.catalog.validate_action(parse_model(TextAction, action).action)
        result = await play_step(self.sessions, self.metrics, session, command)
        return _observation(**result)

    def state(self, session: Session) -> dict[str, Any]:
        if session.closed:
            raise UnknownSession(f"session {session.session_id!r} was closed")
        state = session.state()
        return {"episode_id": session.session_id, "step_count": state["turn"]} | state


def _observation(
    observation: str,
    reward: float,
    terminated: bool,
    truncated: bool,
    info: dict[str, Any],
) -> dict[str, Any]:
    """OpenEnv's serialized observation: ``{"observation", "reward", "done"}``."""
    fields = {"text": observation, "info": info, "terminated": terminated, "truncated": truncated}
    return {
        "observation": fields,
        "reward": reward,
        "done": terminated or truncated,
    }


def parse_model(model: type[BaseModel], data: object) -> Any:
    """``data`` as ``model``, or SchemaError (422 / ``VALIDATION_ERROR``)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}" for e in exc.errors())
        raise SchemaError(problems) from None


def openenv_routers(
    catalog: TextEnv,
    sessions: SessionManager,
    metrics: ServerMetrics,
    max_message_bytes: int,
    client_of: ClientOf,
) -> tuple[APIRouter, APIRouter]:
    """(the root ``/ws`` router, the ``/openenv`` HTTP router)."""
    protocol = OpenEnvProtocol(catalog, sessions, metrics, client_of)
    return _websocket_router(protocol, max_message_bytes), _http_router(protocol)


def _websocket_router(protocol: OpenEnvProtocol, max_message_bytes: int) -> APIRouter:
    router = APIRouter()

    @router.websocket("/ws")
    async def openenv_session(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            session = await protocol.sessions.open(client=protocol.client_of(websocket.scope))
        except AgentGymError as exc:  # at capacity, or the engine cannot be built
            await refuse_session(websocket, exc)
            return
        try:
            await _converse(websocket, protocol, session, max_message_bytes)
        except WebSocketDisconnect:  # the client left while its reply was on the way
            pass
        finally:
            with contextlib.suppress(UnknownSession):  # expired or failed meanwhile
                await protocol.sessions.close(session.session_id)
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # the client closed first
                await websocket.close()

    return router


async def _converse(
    websocket: WebSocket, protocol: OpenEnvProtocol, session: Session, max_message_bytes: int
) -> None:
    """Answer the client's messages, one at a time, until it closes, disconnects or the
    session is gone (expired, or its engine failed)."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        try:
            request = _message(message, max_message_bytes)
            if request["type"] == "close":
                return
            reply = await _answer(protocol, session, request)
        except AgentGymError as exc:
            reply = ws_error(exc)
        await websocket.send_text(json.dumps(reply))
        if session.closed:  # expired (TTL) or its engine failed: the connection was the session
            return


async def _answer(protocol: OpenEnvProtocol, session: Session, request: dict[str, Any]) -> dict[str, Any]:
    data = request.get("data", {})
    match request["type"]:
        case "reset":
            kwargs = protocol.reset_kwargs(parse_model(OpenEnvReset, data))
            return {"type": "observation", "data": await protocol.reset(session, kwargs)}
        case "step":
            return {"type": "observation", "data": await protocol.step(session, data)}
        case "state":
            return {"type": "state", "data": protocol.state(session)}
    raise UnknownMessageType(f"Unknown message type: {request['type']}")


def _message(message: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """A client frame as ``{"type": str, ...}``, or InvalidPayload / PayloadTooLarge / SchemaError."""
    raw = message.get("text")
    if raw is None:
        raw = (message.get("bytes") or b"").decode("utf-8", errors="replace")
    if len(raw.encode("utf-8", errors="replace")) > max_bytes:
        raise PayloadTooLarge(f"message exceeds {max_bytes} bytes")
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidPayload(f"Invalid JSON: {exc}") from None
    if not isinstance(request, dict) or not isinstance(request.get("type"), str):
        raise SchemaError('a message is a JSON object with a string "type"')
    if "data" in request and not isinstance(request["data"], dict):
        raise SchemaError('"data" must be a JSON object')
    return request


def _http_router(protocol: OpenEnvProtocol) -> APIRouter:
    router = APIRouter(prefix=OPENENV_PREFIX, include_in_schema=False)
    catalog, sessions = protocol.catalog, protocol.sessions

    @router.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "healthy"}

    @router.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": catalog.name,
            "description": catalog.description,
            "readme_content": catalog.instruction(),
            "version": catalog.version,
            "author": None,
            "documentation_url": None,
        }

    @router.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            "action": TextAction.model_json_schema(),
            "observation": TextObservation.model_json_schema(),
            "state": TextState.model_json_schema(),
        }

    @router.post("/reset")
    async def reset(request: Request, body: HttpReset | None = None) -> dict[str, Any]:
        body = body or HttpReset()
        kwargs = protocol.reset_kwargs(body)  # bad options are refused before an engine is built
        if body.session_id is not None:
            session = sessions.get(body.session_id)
            return _named(await protocol.reset(session, kwargs), session)
        session = await sessions.open(client=protocol.client_of(request.scope))
        try:
            return _named(await protocol.reset(session, kwargs), session)
        except BaseException:
            with contextlib.suppress(AgentGymError):
                await sessions.close(session.session_id)
            raise

    @router.post("/step")
    async def step(body: HttpStep) -> dict[str, Any]:
        session = sessions.get(body.session_id)
        return _named(await protocol.step(session, body.action), session)

    @router.get("/state")
    async def state(session_id: str = Query(...)) -> dict[str, Any]:
        return protocol.state(sessions.get(session_id))

    return router


def _named(result: dict[str, Any], session: Session) -> dict[str, Any]:
    """An HTTP answer's observation with its session id (over /ws the connection is the session)."""
    result["observation"]["session_id"] = session.session_id
    return result
