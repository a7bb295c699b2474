"""Who may open an MCP session, and what a JSON-RPC request must look like before the
SDK reads it: the ``/mcp`` endpoint's fairness rules.

* **Capacity as v1 answers it.** Opening an MCP session past the server's MCP capacity,
  or past a client's share of it (``--max-sessions-per-client`` × the MCP sessions a slot
  holds), is answered 429 with ``Retry-After`` (when the oldest idle session lapses) and a
  JSON-RPC error whose ``data`` carries the v1 error (``at_capacity``), not the SDK's bare
  503: one client can no longer take every slot for the whole idle TTL.
* **Only what this endpoint serves** reaches the SDK: ``GET`` (the stream for server
  messages, which this server never sends) is 405, and a protocol version of the 2026
  per-request era is -32022 naming the handshake versions.
* **Ids are strings or integers** (JSON-RPC 2.0 §4): an object, array, boolean or
  non-finite number as ``id`` is -32600 (Invalid Request), not an empty 202.

The sessions are counted here from what the SDK answered (the session id an initialize
returned, each later request's header, a DELETE), with the SDK's idle timeout; the SDK's
own limit stays behind this one.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mcp_types import UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope

from agentgym.errors import AtCapacity, MethodNotAllowed
from agentgym.servers.middleware import error_response, replay

INVALID_REQUEST = -32600
SERVER_BUSY = -32000
"""JSON-RPC's implementation-defined server error range: the code of a refused opening."""
VERSION_HEADER = "mcp-protocol-version"
EXPIRY_MARGIN_S = 0.25
"""A session counts this much past the SDK's idle timeout: both time it from the end of its
last request, the SDK a moment before this module does."""


def jsonrpc_error(
    status: int, code: int, message: str, data: Any = None, headers: dict | None = None
) -> JSONResponse:
    error = {"code": code, "message": message} | ({"data": data} if data is not None else {})
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=status, headers=headers)


def unserved(scope: Scope) -> ASGIApp | None:
    """The answer to a request ``/mcp`` does not serve, or None."""
    if scope["method"] == "GET":
        refused = error_response(
            MethodNotAllowed("this MCP server sends no messages of its own: no GET stream")
        )
        refused.headers["allow"] = "POST, DELETE"
        return refused
    version = Request(scope).headers.get(VERSION_HEADER)
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return jsonrpc_error(
            400,
            UNSUPPORTED_PROTOCOL_VERSION,
            f"protocol {version} has no sessions; this server speaks the initialize handshake",
            {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version},
        )
    return None


def invalid_id(body: bytes) -> JSONResponse | None:
    """The -32600 answer to a request whose ``id`` is not a string or an integer; None
    for any other body (malformed JSON and the rest are the SDK's to answer)."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or "id" not in message:
        return None
    given = message["id"]
    if isinstance(given, str) or (isinstance(given, int) and not isinstance(given, bool)):
        return None
    if isinstance(given, float) and math.isfinite(given) and given.is_integer():
        return None
    return jsonrpc_error(400, INVALID_REQUEST, "Invalid Request: id must be a string or an integer")


async def whole_body(scope: Scope, receive: Receive) -> tuple[bytes, Receive]:
    """The request's body, read now, and a ``receive`` that hands it on in one message."""
    body = await Request(scope, receive).body()
    return body, replay({"type": "http.request", "body": body, "more_body": False}, receive)


@dataclass
class McpAdmission:
    """The MCP sessions open, by client, and whether another may open."""

    max_sessions: int
    per_client: int | None
    """A client's MCP sessions at most (None: no per-client share)."""
    idle_s: float
    """The SDK's idle timeout: a session unused this long is gone."""
    open: dict[str, tuple[str | None, float]] = field(default_factory=dict)
    """Session id -> (its client, when it was last used)."""

    def refusal(self, client: str | None) -> JSONResponse | None:
        """The 429 that refuses ``client`` a new MCP session, or None to admit it."""
        now = time.monotonic()
        self._forget_lapsed(now)
        if len(self.open) >= self.max_sessions:
            refused = AtCapacity(f"the server holds its {self.max_sessions} MCP sessions; retry later")
            return self._busy(refused, [seen for _, seen in self.open.values()], now)
        held = Counter(owner for owner, _ in self.open.values())
        if client is not None and self.per_client is not None and held[client] >= self.per_client:
            refused = AtCapacity(
                f"this client holds its quota of {self.per_client} MCP sessions; end one or retry later"
            )
            return self._busy(refused, [seen for owner, seen in self.open.values() if owner == client], now)
        return None

    def opened(self, session_id: str, client: str | None) -> None:
        self.open[session_id] = (client, time.monotonic())

    def used(self, session_id: str) -> None:
        if session_id in self.open:
            self.open[session_id] = (self.open[session_id][0], time.monotonic())

    def closed(self, session_id: str) -> None:
        self.open.pop(session_id, None)

    def _forget_lapsed(self, now: float) -> None:
        for session_id, (_, seen) in list(self.open.items()):
            if now - seen > self.idle_s + EXPIRY_MARGIN_S:
                del self.open[session_id]

    def _busy(self, refused: AtCapacity, last_used: list[float], now: float) -> JSONResponse:
        wait = max(1, math.ceil(min(last_used, default=now) + self.idle_s + EXPIRY_MARGIN_S - now))
        return jsonrpc_error(
            429,
            SERVER_BUSY,
            refused.message,
            refused.to_body() | {"retry_after": wait},
            {"Retry-After": str(wait)},
        )
