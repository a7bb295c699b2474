"""ASGI middleware: bearer-token check and request-size limit.

Both run before FastAPI parses a body, so an oversized or unauthenticated request costs
the server almost nothing and can never reach an engine. (Oversized heads and stalled
requests are refused earlier, by :mod:`agentgym.servers.http_protocol`.)
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgym.contract.errors import AgentGymError, PayloadTooLarge, Unauthorized

log = logging.getLogger(__name__)


def error_response(exc: AgentGymError) -> JSONResponse:
    """The documented error body, with Retry-After where the error has one."""
    headers = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.retry_after else None
    return JSONResponse(exc.to_body(), status_code=exc.status, headers=headers)


def unexpected_error_response(exc: Exception) -> JSONResponse:
    """A bug's answer (500), logged with its traceback."""
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse({"error": {"code": "internal_error", "message": str(exc)}}, status_code=500)


async def send_error(send: Send, exc: AgentGymError) -> None:
    body = json.dumps(exc.to_body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if isinstance(exc, Unauthorized):
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerTokenMiddleware:
    """Require ``Authorization: Bearer <token>`` on every route but ``/health``. The scheme
    is matched case-insensitively (RFC 9110 §11.1: ``bearer`` is the same scheme).

    WebSocket handshakes (OpenEnv's ``/ws``) also take the token as Basic credentials'
    password (what a client sends for ``ws://user:TOKEN@host``; OpenEnv's client can set no
    header) or as the query parameter ``token``; without it the handshake is refused (403)."""

    OPEN_PATHS = frozenset({"/health", "/openenv/health"})

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.OPEN_PATHS:
            allowed = self._matches(bearer_token(scope))
        elif scope["type"] == "websocket":
            allowed = any(self._matches(given) for given in websocket_tokens(scope))
        else:
            allowed = True
        if allowed:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await send_error(send, Unauthorized("missing or wrong bearer token"))
        else:
            # Closing before the handshake is accepted refuses it with HTTP 403 (ASGI spec).
            # A 401 body (ASGI's denial-response extension) would be nicer, but uvicorn logs
            # every such refusal as an error of the app.
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong token"})

    def _matches(self, given: bytes | None) -> bool:
        return token_matches(given, self.expected)


def token_matches(given: bytes | None, expected: bytes) -> bool:
    """Whether a request offered the expected token (in constant time)."""
    return given is not None and hmac.compare_digest(given, expected)


def bearer_token(scope: Scope) -> bytes | None:
    scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
    return given.strip() if scheme.lower() == b"bearer" else None


def websocket_tokens(scope: Scope) -> list[bytes | None]:
    """The tokens a handshake offers: bearer header, Basic password, ``?token=``."""
    scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
    basic_password = None
    if scheme.lower() == b"basic":
        with contextlib.suppress(ValueError):
            basic_password = base64.b64decode(given.strip(), validate=True).partition(b":")[2]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return [bearer_token(scope), basic_password, *(t.encode() for t in query.get("token", []))]


ClientOf = Callable[[Scope], str | None]
"""How a server names the client that sent a request, for its session quotas (None: no quotas)."""


def client_key(scope: Scope, by_token: bool) -> str:
    """Who sent a request, for per-client session quotas: its peer address (uvicorn takes
    it from X-Forwarded-For only when the peer is in ``--forwarded-allow-ips``), or with
    ``by_token`` its bearer token when it sends one (a digest: no token is kept)."""
    tokens = websocket_tokens(scope) if scope["type"] == "websocket" else [bearer_token(scope)]
    token = next((t for t in tokens if t), None) if by_token else None
    if token is not None:
        return "token " + hashlib.sha256(token).hexdigest()
    return f"peer {(scope.get('client') or ('unknown',))[0]}"


class BodySizeLimitMiddleware:
    """Answer 413 when a body exceeds ``max_bytes``, by header or while streaming.

    The body is read in full (up to the limit) before the app runs and then replayed to it:
    a limit raised from inside the app's own body read would be turned into a 400 by
    FastAPI's parser (chunked bodies got ``http_400``), and a proxy (the gateway) must
    not start forwarding a body it will refuse."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        first = None
        if declared is None or not declared.isdigit() or int(declared) <= self.max_bytes:
            first = await self._read_body(receive)
        if first is None:
            await send_error(send, PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes"))
            return
        if first["type"] == "http.disconnect":
            return  # the client left, or its request timed out, before its body came: no one to answer
        await self.app(scope, replay(first, receive), send)

    async def _read_body(self, receive: Receive) -> Message | None:
        """The whole body as one ``http.request`` message (or the disconnect that came
        instead); None when it grew past the limit."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


def guards(max_bytes: int, token: str | None) -> list[tuple[type, dict[str, Any]]]:
    """The checks every request of an env server passes before anything reads its body,
    outermost first, as (ASGI middleware class, its options): the bearer token when the
    server has one, then the body size."""
    chain: list[tuple[type, dict[str, Any]]] = [(BodySizeLimitMiddleware, {"max_bytes": max_bytes})]
    if token:
        chain.insert(0, (BearerTokenMiddleware, {"token": token}))
    return chain


def replay(first: Message, receive: Receive) -> Receive:
    """``receive`` that gives back ``first`` (a body already read) once, then passes on to
    ``receive`` (only http.disconnect comes after a whole body)."""
    pending = [first]

    async def again() -> Message:
        return pending.pop() if pending else await receive()

    return again
