"""The gateway: one entry point in front of a fleet of env servers (``agentgym gateway``).

``/envs/{env}/...`` is wire API v1 of environment ``env``, served by one of its replicas
(env servers started with ``agentgym serve``), so ``EnvClient("http://gw/envs/textworld")``
works unchanged. The gateway is a plain reverse proxy on ``httpx.AsyncClient``:

* **New sessions** (``POST /envs/{env}/sessions``) go to the healthy replica with the
  lowest load (open sessions / capacity; ties rotate). A replica that refuses to connect
  or answers 429 is skipped for the next one.
* **Affinity without shared state.** The gateway hands out session ids of the form
  ``<replica key>-<replica's session id>``, the key being a hash of the replica's URL; so
  every later call of the session lands on its replica, and so would the calls made
  through another gateway (or this one after a restart) with the same replica list.
* **A dead replica** makes the calls of its sessions answer 503 with the wire error
  ``engine_failed`` (the same code an env server uses when an engine dies and takes its
  session with it: the session is gone, start a new one); new sessions go to the others.
* **Health.** Every ``health_interval`` seconds each replica's ``/health`` is polled for
  liveness, sessions and capacity; ``GET /health`` reports them per env.
* **AgentGym-compatible routes** (``/envs/{env}/create``, ``/step`` ...) work too, with the
  replicas' own integer ids (random, so unique across replicas): the gateway remembers
  which replica created an id and, for an id it has not seen (it restarted, or another
  gateway created it), asks the healthy replicas in turn; one that does not know the id
  answers 404 and does nothing, so the first other answer is the session's.
* **OpenEnv** (docs/openenv.md): ``/envs/{env}/ws`` relays an OpenEnv WebSocket session to
  the ``/ws`` of a replica with room (by the last health poll), so OpenEnv's client works
  with ``base_url="ws://gw/envs/{env}"``; the two connections close together, the client
  with the replica's close code, or 1012 when the replica is lost. Its HTTP
  ``/envs/{env}/openenv/reset|step|state`` keep affinity like v1 sessions (the
  ``session_id`` in their bodies gets the replica's key).
* **MCP** (docs/mcp.md): ``/envs/{env}/mcp`` keeps affinity by its ``Mcp-Session-Id``
  header: the initialize (no session yet) goes to the best replica, and the session id it
  answers gets the replica's key, so every later request of the MCP session lands there.
* Anything else under ``/envs/{env}/`` (``/metadata``, ``/tasks``, ``/openapi.json``, an
  env's web pages) goes to any healthy replica: those answers are the same on each.
* **Nothing reaches past a replica's base URL.** A path with a dot segment (``..``) or an
  encoded separator (``%2F``, ``%5C``) is refused (400 ``invalid_path``) before routing, so
  the route chosen is the path asked for (a client cannot pick a replica or reach a page
  through a session's path); every forwarded path is re-quoted, a replica's
  redirect names the gateway's URL, and error messages name a replica by its key: a
  replica's address is never told to a client (``/health`` lists it only to a client
  bearing the gateway's token).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import FastAPI, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as websocket_connect
from websockets.exceptions import InvalidStatus

from agentgym.contract.errors import (
    AgentGymError,
    AtCapacity,
    EngineError,
    InvalidPayload,
    SchemaError,
    UnknownSession,
)
from agentgym.contract.inputs import as_integer, decimal
from agentgym.servers.app import install_error_handlers
from agentgym.servers.middleware import bearer_token, guards, token_matches
from agentgym.servers.openenv import refuse_session
from agentgym.servers.proxying import (
    HOP_BY_HOP,
    MCP_SESSION_HEADER,
    PlainPaths,
    forwarded_headers,
    passthrough,
    path_segment,
    relay,
)
from agentgym.servers.replicas import Fleet, GatewayConfig, Replica

log = logging.getLogger(__name__)

COMPAT_ID_ROUTES = {"step", "reset", "close", "observation", "available_actions"}
"""AgentGym-compatible routes whose request names a session by integer ``id``/``env_idx``."""


def _names_a_compat_session(request: Request) -> bool:
    """A GET naming a session by ``?id=`` or ``?env_idx=``: a dialect's own extra route
    (TextCraft's ``/commands``), which must reach the replica holding that session."""
    return request.method == "GET" and not {"id", "env_idx"}.isdisjoint(request.query_params)


OPENENV_SESSION_ROUTES = {"openenv/reset", "openenv/step", "openenv/state"}
"""OpenEnv's HTTP routes that name a session by ``session_id`` (query for GET, JSON body otherwise)."""

FORWARDED_WEBSOCKET_HEADERS = (b"authorization",)
"""Handshake headers relayed to the replica (its token check reads them)."""

COMPAT_HOMES = 65536
"""Compat ids whose replica the gateway remembers (the oldest forgotten first; a forgotten
id is found again by asking the replicas)."""


class Gateway:
    """The proxying itself; :func:`create_gateway_app` wires it to routes."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.fleet = Fleet(config.replicas)
        limits = httpx.Limits(max_connections=config.max_connections, max_keepalive_connections=64)
        # Replicas keep idle connections 65 s; httpx drops its own after 5 s, so never races them.
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout, connect=5.0), limits=limits)
        self.compat_homes: OrderedDict[tuple[str, int], Replica] = OrderedDict()
        """(env, compat id) -> the replica that holds it, for ids opened or found here."""

    async def poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval)
            try:
                await self.fleet.poll(self.http)
            except Exception:
                log.exception("polling the replicas failed")

    def health(self, request: Request) -> dict[str, Any]:
        """The fleet report; the replicas' URLs only for a request bearing the token."""
        given, token = bearer_token(request.scope), self.config.token
        trusted = bool(token) and token_matches(given, token.encode())
        return self.fleet.report(members=trusted)

    # ----- forwarding ---------------------------------------------------------------

    async def send(
        self,
        replica: Replica,
        request: Request,
        path: str,
        *,
        body: bytes | None = None,
        params: Any = None,
        headers: dict[bytes, bytes] | None = None,
    ) -> httpx.Response:
        """Forward ``request`` to ``replica`` at ``path`` (already quoted; body, query and
        some ``headers`` may be replaced); the answer is streamed. Raises
        :class:`EngineError` (503) if the replica is unreachable."""
        replaced = headers or {}
        kept = forwarded_headers(request.scope, lambda name: name not in HOP_BY_HOP and name not in replaced)
        upstream = self.http.build_request(
            request.method,
            replica.url + path,
            params=request.query_params if params is None else params,
            headers=kept + list(replaced.items()),
            content=await request.body() if body is None else body,
        )
        try:
            return await self.http.send(upstream, stream=True)
        except httpx.TimeoutException as exc:  # a slow engine, not a dead replica
            raise EngineError(f"{replica} did not answer in time") from exc
        except httpx.TransportError as exc:
            replica.healthy = False  # until the next poll says otherwise
            log.warning("replica %s of %r is unreachable: %r", replica.url, replica.env, exc)
            raise EngineError(f"{replica} is unreachable; its sessions are lost") from exc

    async def create_session(self, env: str, request: Request) -> Response:
        """Open a session on the least-loaded healthy replica; its id gets the replica's key."""
        replica, upstream = await self._place(env, request, "/sessions")
        if upstream.status_code != 201:
            return await passthrough(upstream, replica)
        created = json.loads(await upstream.aread())
        created["session_id"] = f"{replica.key}-{created['session_id']}"
        return JSONResponse(created, status_code=201)

    async def session_call(self, env: str, session_id: str, rest: str, request: Request) -> Response:
        """Forward a call of session ``session_id`` to the replica that holds it."""
        replica, local_id = self._session_home(env, session_id)
        upstream = await self.send(replica, request, f"/sessions/{path_segment(local_id)}{quote(rest)}")
        if request.method == "DELETE" and upstream.status_code == 204:
            replica.sessions = max(0, replica.sessions - 1)
        if request.method == "GET" and not rest and upstream.status_code == 200:
            state = json.loads(await upstream.aread())
            state["session_id"] = session_id
            return JSONResponse(state)
        return await passthrough(upstream, replica)

    async def any_replica(self, env: str, path: str, request: Request) -> Response:
        """Forward a session-less request (metadata, tasks, web pages) to a healthy replica."""
        for replica in await self._candidates(env):
            with contextlib.suppress(EngineError):
                return await passthrough(await self.send(replica, request, quote(path)), replica)
        raise self._no_replica(env)

    async def env_health(self, env: str) -> dict[str, Any]:
        """The env's wire ``/health``, summed over its healthy replicas; 503 when none is."""
        report = self.fleet.env_report(env)  # 404 for an env the gateway does not serve
        if not report["healthy"]:
            raise self._no_replica(env)
        return {"status": "ok", "env": env} | report

    # ----- AgentGym-compatible routes -------------------------------------------------

    async def compat_create(self, env: str, request: Request) -> Response:
        """``/create`` on a chosen replica; its id is remembered as that replica's."""
        replica, upstream = await self._place(env, request, "/create")
        if upstream.status_code != 200:
            return await passthrough(upstream, replica)
        answer = json.loads(await upstream.aread())
        # The generic and sciworld dialects answer {"id": N}, webshop a bare N.
        self._remember(env, answer["id"] if isinstance(answer, dict) else answer, replica)
        return JSONResponse(answer)

    async def compat_call(self, env: str, route: str, request: Request) -> Response:
        """A compat route naming its session by ``id``/``env_idx`` (query for GET, JSON body
        otherwise), forwarded as it is to the replica that holds the id: the one remembered,
        else the first healthy replica that knows it (the others answer 404 ``session_not_found``)."""
        fields = dict(request.query_params) if request.method == "GET" else _json_object(await request.body())
        compat_id = _compat_id(fields)
        home = self.compat_homes.get((env, compat_id))
        found: tuple[Replica, httpx.Response] | None = None
        for replica in [home] if home else self.fleet.candidates(env):
            try:
                upstream = await self.send(replica, request, f"/{route}")
            except EngineError:
                if home:  # the session's replica is gone, and the session with it
                    raise
                continue  # if the session was there, it is lost with its replica
            if found is not None:
                await found[1].aclose()
            found = replica, upstream
            if not await _unknown_session(upstream):
                break
        if found is None:
            raise self._no_replica(env)
        replica, upstream = found
        closed = route == "close" and upstream.status_code == 200
        if closed:
            replica.sessions = max(0, replica.sessions - 1)  # until the next poll
        if closed or upstream.status_code == 404:
            self.compat_homes.pop((env, compat_id), None)
        elif upstream.status_code < 300:
            self._remember(env, compat_id, replica)
        return await passthrough(upstream, replica)

    def _remember(self, env: str, compat_id: int, replica: Replica) -> None:
        self.compat_homes[env, compat_id] = replica
        self.compat_homes.move_to_end((env, compat_id))
        if len(self.compat_homes) > COMPAT_HOMES:
            self.compat_homes.popitem(last=False)

    # ----- OpenEnv ----------------------------------------------------------------------

    async def websocket_session(self, env: str, client: WebSocket) -> None:
        """Relay an OpenEnv session to a replica's ``/ws``. A replica that refuses the
        handshake (a wrong token) gets the client refused the same way (403); when every
        replica is full or down, the client gets OpenEnv's error reply and a close."""
        try:
            upstream = await self._connect_upstream(env, client)
        except InvalidStatus:
            await client.close(code=1008)
            return
        except AgentGymError as exc:  # an unknown env, none with room, none reachable
            await client.accept()
            await refuse_session(client, exc)
            return
        replica, connection = upstream
        await client.accept()
        code, reason = 1011, "the gateway failed"  # replaced unless the relay itself raised
        try:
            code, reason = await relay(client, connection)
        finally:
            replica.sessions = max(0, replica.sessions - 1)
            await connection.close()
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await client.close(code=code, reason=reason)

    async def _connect_upstream(self, env: str, client: WebSocket) -> tuple[Replica, ClientConnection]:
        candidates = await self._candidates(env)
        with_room = [r for r in candidates if r.sessions < r.capacity]
        if candidates and not with_room:
            raise AtCapacity(f"every replica of {env!r} is at capacity")
        relayed = forwarded_headers(client.scope, lambda name: name in FORWARDED_WEBSOCKET_HEADERS)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in relayed]
        query = f"?{client.url.query}" if client.url.query else ""
        for replica in with_room:
            url = "ws" + replica.url.removeprefix("http") + "/ws" + query
            try:
                connection = await websocket_connect(
                    url, additional_headers=headers, open_timeout=10.0, max_size=None
                )
            except (OSError, TimeoutError):
                replica.healthy = False  # until the next poll says otherwise
                continue
            replica.sessions += 1  # until the next poll
            return replica, connection
        raise self._no_replica(env)

    async def openenv_call(self, env: str, route: str, request: Request) -> Response:
        """OpenEnv's HTTP reset/step/state: a reset without ``session_id`` opens a session
        on the best replica; the rest go to the replica named by the id's key."""
        if request.method == "GET":
            replica, query = self._openenv_target(env, dict(request.query_params))
            upstream = await self.send(replica, request, f"/{route}", params=query)
        else:
            payload = _json_object(await request.body())
            if route == "openenv/reset" and payload.get("session_id") is None:
                replica, upstream = await self._place(env, request, f"/{route}")
            else:
                replica, payload = self._openenv_target(env, payload)
                upstream = await self.send(replica, request, f"/{route}", body=json.dumps(payload).encode())
        if upstream.status_code != 200:
            return await passthrough(upstream, replica)
        answer = json.loads(await upstream.aread())
        named = [answer] if route == "openenv/state" else [answer.get("observation", {})]
        for fields in named:  # the replica's own id -> the gateway's
            fields.update(
                {k: f"{replica.key}-{v}" for k, v in fields.items() if k in ("session_id", "episode_id")}
            )
        return JSONResponse(answer)

    def _openenv_target(self, env: str, fields: dict[str, Any]) -> tuple[Replica, dict[str, Any]]:
        """(replica, ``fields`` with the gateway's ``session_id`` replaced by the replica's own)."""
        session_id = fields.get("session_id")
        if not isinstance(session_id, str):
            raise SchemaError("session_id (a string) is required")
        replica, local_id = self._session_home(env, session_id)
        return replica, fields | {"session_id": local_id}

    # ----- MCP --------------------------------------------------------------------------

    async def mcp_call(self, env: str, request: Request) -> Response:
        """An MCP request: one without a session (the initialize) opens it on the best
        replica; the rest go to the replica named by the key in their ``Mcp-Session-Id``
        (``passthrough`` puts the key into the id a replica answers)."""
        given = request.headers.get(MCP_SESSION_HEADER.decode())
        if given is None:
            replica, upstream = await self._place(env, request, "/mcp")
        else:
            replica, local_id = self._session_home(env, given)
            upstream = await self.send(
                replica, request, "/mcp", headers={MCP_SESSION_HEADER: local_id.encode()}
            )
        return await passthrough(upstream, replica)

    # ----- helpers ----------------------------------------------------------------------

    def _session_home(self, env: str, session_id: str) -> tuple[Replica, str]:
        """(replica, the replica's own id) of a gateway session id ``<key>-<id>``."""
        key, _, local_id = session_id.partition("-")
        if not local_id:
            raise UnknownSession(f"no session {session_id!r} (never created, closed or expired)")
        return self.fleet.by_key(env, key), local_id

    async def _candidates(self, env: str) -> list[Replica]:
        """Healthy replicas to try; when none looks healthy, poll once before giving up
        (a replica may have come back since the last poll)."""
        candidates = self.fleet.candidates(env)
        if not candidates:
            await self.fleet.poll(self.http)
            candidates = self.fleet.candidates(env)
        return candidates

    async def _place(self, env: str, request: Request, path: str) -> tuple[Replica, httpx.Response]:
        """Send a session-opening request to the best replica that takes it, skipping those
        that are unreachable (nothing ran there) or at capacity. 429 when all are full."""
        body, retry_after = await request.body(), None
        for replica in await self._candidates(env):
            replica.opening += 1
            try:
                upstream = await self.send(replica, request, path, body=body)
            except EngineError:
                if replica.healthy:  # a timeout: the create may have run, so never resend it
                    raise
                continue
            finally:
                replica.opening -= 1
            if upstream.status_code != 429:
                if upstream.status_code < 300:
                    replica.sessions += 1  # until the next poll
                return replica, upstream
            retry_after = float(upstream.headers.get("retry-after", 1))
            await upstream.aclose()
        if retry_after is not None:
            raise AtCapacity(f"every replica of {env!r} is at capacity", retry_after=retry_after)
        raise self._no_replica(env)

    def _no_replica(self, env: str) -> EngineError:
        count = len(self.fleet.replicas(env))
        return EngineError(
            f"no replica of {env!r} can take the request ({count} configured, none healthy or free)"
        )


async def _unknown_session(upstream: httpx.Response) -> bool:
    """Whether a replica answered 404 ``session_not_found`` (its body is read to tell)."""
    if upstream.status_code != 404:
        return False
    await upstream.aread()
    with contextlib.suppress(ValueError, LookupError, TypeError):  # not our error body
        return upstream.json()["error"]["code"] == UnknownSession.code
    return False


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body or b"{}")
    except (ValueError, RecursionError):  # malformed, not UTF-8, a 5000-digit number, deep nesting
        raise InvalidPayload("request body is not a JSON object") from None
    if not isinstance(payload, dict):
        raise InvalidPayload("request body must be a JSON object with 'id' (or 'env_idx')")
    return payload


def _compat_id(fields: dict[str, Any]) -> int:
    """The integer id naming the session, as the env servers read it: ``env_idx`` when
    present, else ``id`` (AgentGym's SearchQA client sends its task index as ``id`` beside
    ``env_idx``). JSON integer, integral float, or digits in a query string; 422 for
    anything else (1e999, Infinity, a list, ...)."""
    value = fields.get("env_idx") if fields.get("env_idx") is not None else fields.get("id")
    if isinstance(value, str):
        value = decimal(value, max_digits=30) if value else None
    return as_integer(value, "'env_idx' (or 'id')", 0)


def create_gateway_app(config: GatewayConfig) -> FastAPI:
    """The gateway as an ASGI app (see the module docstring for what it routes where)."""
    gateway = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.fleet.poll(gateway.http)  # know the replicas before the first request
        poller = asyncio.create_task(gateway.poll_forever())
        yield
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await gateway.http.aclose()

    # No slash redirects of its own: a path it does not route is a 404, whatever it ends with
    # (a redirect a client gets is a replica's, re-addressed to the gateway by passthrough).
    app = FastAPI(title="AgentGym gateway", lifespan=lifespan, redirect_slashes=False)
    app.state.gateway = gateway
    install_error_handlers(app)
    # The env servers' checks, without the token: each replica checks the token it is sent.
    for middleware, options in reversed(guards(config.max_body_bytes, None)):  # innermost first
        app.add_middleware(middleware, **options)
    app.add_middleware(PlainPaths)
    any_method = ["GET", "POST", "PUT", "PATCH", "DELETE"]

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        """Per env: replicas, healthy replicas, sessions and capacity; each replica's state
        (its URL included) only with the token."""
        return gateway.health(request)

    @app.get("/envs/{env}/health")
    async def env_health(env: str) -> dict[str, Any]:
        return await gateway.env_health(env)

    @app.post("/envs/{env}/sessions")
    async def create_session(env: str, request: Request) -> Response:
        return await gateway.create_session(env, request)

    @app.api_route("/envs/{env}/sessions/{session_id}{rest:path}", methods=any_method)
    async def session_call(env: str, session_id: str, rest: str, request: Request) -> Response:
        return await gateway.session_call(env, session_id, rest, request)

    @app.post("/envs/{env}/create")
    async def compat_create(env: str, request: Request) -> Response:
        return await gateway.compat_create(env, request)

    @app.websocket("/envs/{env}/ws")
    async def openenv_session(env: str, websocket: WebSocket) -> None:
        await gateway.websocket_session(env, websocket)

    @app.api_route("/envs/{env}/{path:path}", methods=any_method)
    async def other(env: str, path: str, request: Request) -> Response:
        if path in COMPAT_ID_ROUTES or _names_a_compat_session(request):
            return await gateway.compat_call(env, path, request)
        if path in OPENENV_SESSION_ROUTES:
            return await gateway.openenv_call(env, path, request)
        if path == "mcp":
            return await gateway.mcp_call(env, request)
        return await gateway.any_replica(env, f"/{path}", request)

    return app
