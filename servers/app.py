"""The app factory: any registered environment behind wire API v1 (+ AgentGym routes).

``create_app(ServerConfig(env="textworld"))`` returns a FastAPI app. One *catalog*
instance of the environment answers ``/metadata`` and ``/tasks``; every session gets
its own fresh instance from the registry.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgym import registry
from agentgym.contract.core import WEB_PREFIX, TextEnv
from agentgym.contract.errors import (
    AgentGymError,
    InvalidPayload,
    MethodNotAllowed,
    NotFound,
    SchemaError,
)
from agentgym.hosting import DEFAULT_MAX_SESSIONS
from agentgym.servers.compat import compat_router
from agentgym.servers.episodes import play_step, reset_kwargs, start_session, task_page
from agentgym.servers.http_protocol import LIMITS_STATE, REQUEST_TIMEOUT_S, RequestLimits
from agentgym.servers.mcp import mcp_endpoint
from agentgym.servers.metrics import CONTENT_TYPE, ServerMetrics
from agentgym.servers.middleware import (
    ClientOf,
    client_key,
    error_response,
    guards,
    unexpected_error_response,
)
from agentgym.servers.openenv import openenv_routers
from agentgym.servers.sessions import EngineHost, SessionManager, ThreadEngines
from agentgym.servers.step_lane import Step, StepLane, is_json_step
from agentgym.servers.workers import WorkerEngines, default_workers
from agentgym.wire import (
    CreateSessionRequest,
    ErrorResponse,
    Health,
    Metadata,
    ResetRequest,
    ResetResult,
    SessionCreated,
    SessionState,
    StepRequest,
    StepResult,
    TaskList,
)

log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    """Everything one env server needs. Every field has a CLI flag on ``agentgym serve``."""

    env: str
    """Registered environment name."""
    env_config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment's constructor."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    """Live sessions at most; more creates get 429 with Retry-After."""
    ttl: float = 600.0
    """Idle seconds after which a session is closed and its engine freed."""
    mcp_ttl: float = 30.0
    """Idle seconds after which an MCP session that holds no episode is ended (one that
    holds an episode keeps ``ttl``): a bare handshake costs no engine, only an MCP slot."""
    token: str | None = None
    """When set, every route but /health needs ``Authorization: Bearer <token>``."""
    max_body_bytes: int = 64 * 1024
    """Larger request bodies get 413."""
    engine_threads: int = 16
    """Threads that run blocking engine calls of envs hosted in the server process."""
    engine_workers: int | None = None
    """Worker processes hosting the engines of envs that set ``engine_process`` (see
    :mod:`agentgym.servers.workers`); ``None``: one per CPU core; 0: threads of the server."""
    warm: int | None = None
    """Engines kept started ahead of demand (``TextEnv.warm_engines``), shared out among the
    worker processes; ``None``: :func:`default_warm`."""
    step_deadline: float | None = 60.0
    """Seconds a step (or any engine call but a reset) may take before its session is
    failed with 503 ``engine_failed``; a backstop for engine hangs the input rules miss."""
    reset_deadline: float | None = 600.0
    """Seconds a reset may take (it may wait for its game to be generated)."""
    max_sessions_per_client: int | None = None
    """Live sessions one client may hold, created by any route (429 beyond), so that no
    client can take every slot; None: no quota. A client is its peer address (behind a
    proxy: the X-Forwarded-For that uvicorn trusts from ``--forwarded-allow-ips``)."""
    quota_by_token: bool = False
    """Count a client's sessions by its bearer token instead (requests without one: by
    address): for a server behind a proxy that gives each user a token of their own.
    Never on a server open to clients directly, which could send a fresh token per session."""
    max_header_bytes: int = 16 * 1024
    """A request head (request line and header fields) larger than this gets 431."""
    max_header_fields: int = 100
    """A request with more header fields gets 431."""
    request_timeout: float = REQUEST_TIMEOUT_S
    """Seconds a request (head and body) may take to arrive (408 after): a stalled request,
    or a body shorter than its Content-Length, frees its connection."""


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 404, 409, 413, 422, 429, 503)
}


def default_warm(max_sessions: int) -> int:
    """Engines started ahead by default: two per CPU core (enough to keep the cores busy
    while more start on demand), never more than the sessions the server takes."""
    return min(max_sessions, 2 * default_workers())


def engine_host(config: ServerConfig, catalog: TextEnv) -> EngineHost:
    """Worker processes for envs that ask for them (``engine_process``), else threads."""
    warm = default_warm(config.max_sessions) if config.warm is None else config.warm
    if type(catalog).engine_process and config.engine_workers != 0:
        workers = min(config.engine_workers or default_workers(), config.max_sessions)
        return WorkerEngines(
            registry.resolve(config.env),
            type(catalog).worker_config(dict(config.env_config), workers),
            catalog=catalog,
            workers=workers,
            threads=config.max_sessions,  # one per pinned session at most (created lazily)
            warm=-(-warm // workers),
        )
    return ThreadEngines(
        lambda: registry.make(config.env, **config.env_config),
        config.engine_threads,
        warm_up=lambda: catalog.warm_engines(warm),
    )


class EnvServerApp(FastAPI):
    """FastAPI, except that the requests :func:`~agentgym.servers.step_lane.is_json_step`
    accepts (JSON steps) go to ``step_lane`` (the step lane behind the server's guards)
    instead of through FastAPI's middleware stack; the lane hands every body it does not
    take to :meth:`through_fastapi`."""

    step_lane: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.step_lane is not None and is_json_step(scope):
            await self.step_lane(scope, receive, send)
        else:
            await self.through_fastapi(scope, receive, send)

    async def through_fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


def create_app(config: ServerConfig) -> EnvServerApp:
    catalog = registry.make(config.env, **config.env_config)
    sessions = SessionManager(
        engine_host(config, catalog),
        max_sessions=config.max_sessions,
        ttl=config.ttl,
        step_deadline=config.step_deadline,
        reset_deadline=config.reset_deadline,
        max_per_client=config.max_sessions_per_client,
    )
    metrics = ServerMetrics(config.env, sessions)
    limits = RequestLimits(config.max_header_bytes, config.max_header_fields, config.request_timeout)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Any]]:
        catalog.warm_up()
        await sessions.start()
        async with mcp.running():
            yield {LIMITS_STATE: limits}  # the lifespan state is where our HTTP protocol reads them
        await sessions.shutdown()
        catalog.close()

    def client_of(scope: Scope) -> str | None:
        """Whose quota a new session counts against (None: no quotas)."""
        return None if config.max_sessions_per_client is None else client_key(scope, config.quota_by_token)

    mcp = mcp_endpoint(
        catalog, sessions, metrics, client_of, max_body_bytes=config.max_body_bytes, bare_ttl=config.mcp_ttl
    )

    app = EnvServerApp(
        title=f"AgentGym env server: {config.env}",
        version=catalog.version,
        description=catalog.description,
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    app.state.sessions, app.state.catalog, app.state.metrics = sessions, catalog, metrics
    install_error_handlers(app)
    step = step_function(catalog, sessions, metrics)
    v1 = _v1_router(config, catalog, sessions, metrics, step, client_of)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    lane: ASGIApp = StepLane(app.through_fastapi, step, STEP_ROUTE, StepResult, metrics)
    for middleware, options in reversed(guards(config.max_body_bytes, config.token)):  # innermost first
        app.add_middleware(middleware, **options)
        lane = middleware(lane, **options)
    app.step_lane = lane
    app.include_router(v1)
    app.include_router(compat_router(catalog, sessions, client_of))
    for router in openenv_routers(catalog, sessions, metrics, config.max_body_bytes, client_of):
        app.include_router(router)
    app.router.routes.append(mcp.route())
    web_router = catalog.web_router()
    if web_router is not None:
        app.include_router(web_router, prefix=WEB_PREFIX, include_in_schema=False)
    return app


STEP_ROUTE = "/sessions/{session_id}/step"


def step_function(catalog: TextEnv, sessions: SessionManager, metrics: ServerMetrics) -> Step:
    """The step route's work, shared with :class:`StepLane`: the action checked before the
    engine thread (400, session intact), then played."""

    async def step(session_id: str, action: object) -> dict[str, Any]:
        checked = catalog.validate_action(action)
        return await play_step(sessions, metrics, sessions.get(session_id), checked)

    return step


def _v1_router(
    config: ServerConfig,
    catalog: TextEnv,
    sessions: SessionManager,
    metrics: ServerMetrics,
    step: Step,
    client_of: ClientOf,
):
    from fastapi import APIRouter

    router = APIRouter(tags=["v1"])

    @router.get("/health", response_model=Health)
    async def health() -> dict[str, Any]:
        """Liveness and load: live sessions and capacity. Never needs the bearer token."""
        return {
            "status": "ok",
            "env": config.env,
            "sessions": len(sessions),
            "capacity": sessions.max_sessions,
        }

    @router.get("/metadata", response_model=Metadata)
    async def metadata() -> dict[str, Any]:
        """What the environment is: instruction for agents, action format, split sizes, turn limit."""
        return catalog.metadata()

    @router.get("/tasks", response_model=TaskList)
    async def tasks(
        split: str | None = None,
        offset: int = Query(0, ge=0),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        """The fixed task lists, one split or all (split after split), paged by offset/limit."""
        return task_page(catalog, split, offset, limit)

    @router.post("/sessions", status_code=201, response_model=SessionCreated)
    async def create_session(request: Request, body: CreateSessionRequest | None = None) -> dict[str, Any]:
        """Open a session with its own engine and start an episode; 429 when at capacity."""
        kwargs = reset_kwargs(catalog, body)  # bad options are refused before an engine is built
        session, observation, info = await start_session(sessions, kwargs, client=client_of(request.scope))
        return {"session_id": session.session_id, "observation": observation, "info": info}

    @router.post("/sessions/{session_id}/reset", response_model=ResetResult)
    async def reset_session(session_id: str, body: ResetRequest | None = None) -> dict[str, Any]:
        """Start a new episode in the session: on the task chosen as for create, or, when the
        body names none (no task_id, split or index), on the session's current task again."""
        session = sessions.get(session_id)
        kwargs = reset_kwargs(catalog, body)
        current = session.env.current_task
        if current and not (body and (body.task_id or body.split or body.index is not None)):
            kwargs["task_id"] = current.task_id
        observation, info = await sessions.call(session, "reset", deadline=sessions.reset_deadline, **kwargs)
        return {"observation": observation, "info": info}

    @router.post(STEP_ROUTE, response_model=StepResult)
    async def step_session(session_id: str, body: StepRequest) -> dict[str, Any]:
        """Play one action. 409 once the episode terminated or was truncated."""
        return await step(session_id, body.action)

    @router.get("/sessions/{session_id}", response_model=SessionState)
    async def get_session(session_id: str) -> dict[str, Any]:
        """The session's task, turn, done flag and last observation and info."""
        return sessions.get(session_id).state()

    @router.delete("/sessions/{session_id}", status_code=204, response_class=Response)
    async def delete_session(session_id: str) -> Response:
        """Close the session and free its engine."""
        await sessions.close(session_id)
        return Response(status_code=204)

    @router.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus text: requests and latency by route, sessions, finished episodes."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return router


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AgentGymError)
    async def on_agentgym_error(_: Request, exc: AgentGymError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(_is_unparseable_body(e) for e in errors):
            return error_response(InvalidPayload("request body is not a JSON object"))
        return error_response(SchemaError("; ".join(_describe(e) for e in errors)))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        documented = _documented_http_error(exc)
        if documented is not None:
            return error_response(documented)
        body = {"error": {"code": f"http_{exc.status_code}", "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(exc)


def _documented_http_error(exc: StarletteHTTPException) -> AgentGymError | None:
    """Starlette's and FastAPI's own HTTP errors as our documented codes: 404 unknown
    route, 405 wrong method, and 400, which FastAPI raises when it cannot parse a body at
    all (not UTF-8, nested deeper than the JSON parser's recursion limit, an integer
    longer than Python's 4300-digit limit)."""
    if exc.status_code == 404:
        return NotFound(f"no such route: {exc.detail}")
    if exc.status_code == 405:
        return MethodNotAllowed(str(exc.detail))
    if exc.status_code == 400:
        return InvalidPayload(f"request body could not be parsed as JSON: {exc.detail}")
    return None


def _is_unparseable_body(error: dict[str, Any]) -> bool:
    """Malformed JSON, or a body that is not an object (text, a list, a bare number)."""
    whole_body = tuple(error.get("loc", ())) == ("body",)
    return error.get("type") == "json_invalid" or (whole_body and error.get("type") != "missing")


def _describe(error: dict[str, Any]) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    return f"{location or 'body'}: {error.get('msg', 'invalid')}"


class MetricsMiddleware:
    """Pure ASGI (FastAPI's ``@app.middleware`` costs ~0.3 ms a request): counts requests
    and latency by route template, read from the scope once routing has filled it in."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_and_record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            # Any token is a valid HTTP method: label only the standard ones, so made-up
            # methods cannot create label sets without bound.
            method = scope["method"] if scope["method"] in HTTP_METHODS else "other"
            self.metrics.observe(route, method, status, time.perf_counter() - start)
