"""ASGI middleware: bearer-token check and request-size limit.

Both run before FastAPI parses a body, so an oversized or unauthenticated request costs
the server almost nothing and can never reach an engine.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgym.errors import AgentGymError, PayloadTooLarge, Unauthorized


async def send_error(send: Send, exc: AgentGymError) -> None:
    body = json.dumps(exc.to_body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if isinstance(exc, Unauthorized):
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerTokenMiddleware:
    """Require ``Authorization: Bearer <token>`` on every route but ``/health``."""

    OPEN_PATHS = frozenset({"/health"})

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send_error(send, Unauthorized("missing or wrong bearer token"))
                return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Answer 413 when a body exceeds ``max_bytes``, by header or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes")
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, too_large)
            return

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large
            return message

        try:
            await self.app(scope, limited_receive, send)
        except PayloadTooLarge as exc:
            await send_error(send, exc)
