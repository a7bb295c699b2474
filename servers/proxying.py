"""What the gateway's proxying is made of: forwarding a request's headers and a replica's
answer (never its address), relaying a WebSocket, and refusing paths that traverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from urllib.parse import quote

import httpx
from fastapi import Response, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import EXTERNAL_CLOSE_CODES

from agentgym.contract.errors import InvalidPath
from agentgym.servers.middleware import send_error
from agentgym.servers.replicas import Replica

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer"}
    | {b"transfer-encoding", b"upgrade", b"host", b"content-length"}
)
"""Headers that describe one connection, not the message: never forwarded (RFC 9110 §7.6.1;
content-length is recomputed for every forwarded body). Headers are forwarded as raw
bytes both ways: a value that is not ASCII (``X-Name: café``) passes as the servers take it."""

MCP_SESSION_HEADER = b"mcp-session-id"
"""The header that names an MCP session (its id gets the replica's key, as v1 session ids)."""

REPLICA_LOST = 1012
"""The close code a relayed WebSocket client gets when its replica's connection drops
without a close frame (the replica died): RFC 6455's "service restart", connect again for
a new session."""


async def passthrough(upstream: httpx.Response, replica: Replica) -> Response:
    """Stream a replica's answer back as it is (status, raw headers and bytes), except that
    a redirect names the gateway's URL, never the replica's, and an MCP session id gets the
    replica's key."""
    # A body already read (a compat probe's 404) goes out as read.
    body = iter([upstream.content]) if upstream.is_stream_consumed else upstream.aiter_raw()
    response = StreamingResponse(
        body, status_code=upstream.status_code, background=BackgroundTask(upstream.aclose)
    )
    response.raw_headers = []
    for name, value in upstream.headers.raw:
        name = name.lower()
        if name == b"location":
            value = public_location(replica, value)
        elif name == MCP_SESSION_HEADER:
            value = f"{replica.key}-".encode() + value
        if name not in HOP_BY_HOP - {b"content-length"}:
            response.raw_headers.append((name, value))
    return response


def forwarded_headers(scope: Scope, keep: Callable[[bytes], bool]) -> list[tuple[bytes, bytes]]:
    """The request's headers that ``keep`` keeps, raw, with the client's address appended
    to ``X-Forwarded-For``: a replica that trusts the gateway's address (uvicorn's
    ``--forwarded-allow-ips``, 127.0.0.1 by default) then sees the client, not the gateway
    (per-client session quotas); uvicorn reads the chain from the right, so an address the
    client put there is not taken for its own."""
    headers = [(k, v) for k, v in scope["headers"] if keep(k) and k != b"x-forwarded-for"]
    chain = [v for k, v in scope["headers"] if k == b"x-forwarded-for"]
    if scope.get("client"):
        chain.append(scope["client"][0].encode())
    return headers + ([(b"x-forwarded-for", b", ".join(chain))] if chain else [])


def public_location(replica: Replica, location: bytes) -> bytes:
    """A replica's ``Location`` (its own slash redirect, say) as the same resource's path
    on the gateway; a location on another site is left alone."""
    target = location.decode("latin-1")
    if target.startswith(replica.url + "/"):
        target = target.removeprefix(replica.url)
    elif not target.startswith("/") or target.startswith("//"):
        return location
    path, sep, query = target.partition("?")
    session = re.fullmatch(r"/sessions/([^/]+)(.*)", path)
    if session:  # the replica's session id -> the gateway's
        path = f"/sessions/{replica.key}-{session[1]}{session[2]}"
    return f"/envs/{path_segment(replica.env)}{path}{sep}{query}".encode("latin-1")


def path_segment(text: str) -> str:
    """``text`` as one quoted path segment: ``/``, ``?``, ``#`` and dots encoded, so that an
    id like ``..`` can never become a dot segment that an HTTP client resolves."""
    return quote(text, safe="").replace(".", "%2E")


async def relay(client: WebSocket, upstream: ClientConnection) -> tuple[int, str]:
    """Pass messages both ways until either side closes; the close code and reason the
    client gets: the replica's own close frame, :data:`REPLICA_LOST` when the replica's
    connection dropped without one, 1000 when the client left first."""

    async def client_to_upstream() -> None:
        with contextlib.suppress(WebSocketDisconnect, ConnectionClosed):
            while (message := await client.receive())["type"] != "websocket.disconnect":
                await upstream.send(message["text"] if message.get("text") is not None else message["bytes"])

    async def upstream_to_client() -> None:
        with contextlib.suppress(WebSocketDisconnect, ConnectionClosed, RuntimeError):
            async for message in upstream:
                await (client.send_text(message) if isinstance(message, str) else client.send_bytes(message))

    pumps = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    closed = upstream.protocol.close_rcvd
    if upstream.protocol.close_sent is None and closed is None and upstream.close_code is not None:
        return REPLICA_LOST, "the replica was lost, and the session with it"
    if closed is not None and closed.code in EXTERNAL_CLOSE_CODES | set(range(3000, 5000)):
        return closed.code, closed.reason
    return 1000, ""


ENCODED_SEPARATOR = re.compile(rb"%(2f|5c)", re.IGNORECASE)
"""``%2F`` and ``%5C``: a ``/`` or ``\\`` inside one path segment, which the server decodes
into a separator before routing."""


def traverses(scope: Scope) -> bool:
    """Whether a request's path holds a dot segment (``.``, ``..``) or an encoded separator:
    what no client of ours sends, and what could make the route chosen here differ from
    the path a replica resolves."""
    raw = scope.get("raw_path") or scope["path"].encode()
    segments = scope["path"].split("/")
    return bool(ENCODED_SEPARATOR.search(raw)) or any(segment in (".", "..") for segment in segments)


class PlainPaths:
    """Refuse (400; a WebSocket handshake: close 1008) any request whose path
    :func:`traverses`, before it is routed. The server has already decoded ``%2F`` into
    ``/``, so ``sessions/KEY-x%2F..%2F..%2Fsessions`` would otherwise route as another path
    than the one asked for (a session created, or a page read, where the client chose)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not traverses(scope):
            return await self.app(scope, receive, send)
        reason = "the path holds a dot segment or an encoded separator (%2F, %5C)"
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008, "reason": reason})
        await send_error(send, InvalidPath(reason))
