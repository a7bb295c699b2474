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
    """Require ``Authorization: Bearer <token>`` on every route but ``/health``. The scheme
    is matched case-insensitively (RFC 9110 §11.1: ``bearer`` is the same scheme)."""

    OPEN_PATHS = frozenset({"/health"})

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.OPEN_PATHS:
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                await send_error(send, Unauthorized("missing or wrong bearer token"))
                return
        await self.app(scope, receive, send)


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
        too_large = PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes")
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, too_large)
            return
        first = await self._read_body(receive)
        if first is None:
            await send_error(send, too_large)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # only http.disconnect comes after the body
            replayed = True
            return first

        await self.app(scope, replay, send)

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
