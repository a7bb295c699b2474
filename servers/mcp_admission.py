"""Who may open an MCP session, and what a JSON-RPC request must look like before the
SDK reads it: the ``/mcp`` endpoint's fairness rules.

* **Capacity as v1 answers it.** Opening an MCP session past the server's MCP capacity,
  or past a client's share of it (``--max-sessions-per-client`` × the MCP sessions a slot
  holds), is answered 429 with ``Retry-After`` (when the oldest idle session lapses) and a
  JSON-RPC error whose ``data`` carries the v1 error (``at_capacity``), not the SDK's bare
  503: one client can no longer take every slot for the whole idle TTL.
* **A session without an episode lapses soon.** One idle for the bare timeout
  (``--mcp-ttl``) while it holds no env session is released, its slot with it; one that
  holds an episode keeps the full idle TTL (the SDK's). A bare handshake costs no engine,
  so only its slot is at stake, and that is what a client hoarding handshakes takes.
* **Only what this endpoint serves** reaches the SDK: ``GET`` (the stream for server
  messages, which this server never sends) is 405, and a protocol version of the 2026
  per-request era is -32022 naming the handshake versions.
* **Ids are strings or integers** (JSON-RPC 2.0 §4): an object, array, boolean or
  non-finite number as ``id`` is -32600 (Invalid Request), not an empty 202.

The sessions are counted here from what the SDK answered (the session id an initialize
returned, each later request's header, a DELETE), each timed as the SDK times it (from the
end of its last request, never while one is in flight); the SDK's own limit stays behind
this one. Which sessions lapsed is this module's answer; ending them in the SDK is the
endpoint's (:mod:`agentgym.servers.mcp`).
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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgym.contract.errors import AtCapacity, MethodNotAllowed
from agentgym.servers.middleware import error_response, replay

INVALID_REQUEST = -32600
SERVER_BUSY = -32000
"""JSON-RPC's implementation-defined server error range: the code of a refused opening."""
MCP_PATH = "/mcp"
SESSION_HEADER = "mcp-session-id"
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


async def answered(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> tuple[int | None, str | None]:
    """Run ``app`` on the request; the HTTP status it answered (None: no answer) and the
    MCP session id its answer named."""
    status: int | None = None
    session: str | None = None

    async def watch(message: Message) -> None:
        nonlocal status, session
        if message["type"] == "http.response.start":
            status = message["status"]
            named = dict(message.get("headers") or []).get(SESSION_HEADER.encode())
            session = named.decode("latin-1") if named else None
        await send(message)

    await app(scope, receive, watch)
    return status, session


async def delete_session(app: ASGIApp, session_id: str) -> None:
    """End MCP session ``session_id`` in ``app`` (the SDK's manager) as its client's DELETE
    would; nobody reads the answer (404 if the SDK had ended it already)."""
    scope = {
        "type": "http",
        "method": "DELETE",
        "path": MCP_PATH,
        "query_string": b"",
        "headers": [(SESSION_HEADER.encode(), session_id.encode("latin-1"))],
    }
    request = {"type": "http.request", "body": b"", "more_body": False}

    async def hung_up() -> Message:
        return {"type": "http.disconnect"}

    async def discard(_: Message) -> None:
        pass

    await app(scope, replay(request, hung_up), discard)


@dataclass
class _Open:
    """One open MCP session, as admission sees it."""

    client: str | None
    idle_s: float
    """How long it may idle: the full TTL while it holds an episode, else the bare timeout."""
    seen: float = field(default_factory=time.monotonic)
    """When its last request ended."""
    in_flight: int = 0
    """Its requests being served: it does not idle meanwhile."""

    def lapses_at(self, now: float) -> float:
        return (now if self.in_flight else self.seen) + self.idle_s + EXPIRY_MARGIN_S


@dataclass
class McpAdmission:
    """The MCP sessions open, by client, and whether another may open."""

    max_sessions: int
    per_client: int | None
    """A client's MCP sessions at most (None: no per-client share)."""
    idle_s: float
    """The SDK's idle timeout: a session unused this long is gone."""
    bare_idle_s: float
    """The idle timeout of a session that holds no episode (at most ``idle_s``)."""
    open: dict[str, _Open] = field(default_factory=dict)
    """Session id -> the session."""

    def refusal(self, client: str | None) -> JSONResponse | None:
        """The 429 that refuses ``client`` a new MCP session, or None to admit it (call
        :meth:`lapsed` first: lapsed sessions still count here)."""
        now = time.monotonic()
        if len(self.open) >= self.max_sessions:
            refused = AtCapacity(f"the server holds its {self.max_sessions} MCP sessions; retry later")
            return self._busy(refused, list(self.open.values()), now)
        held = Counter(session.client for session in self.open.values())
        if client is not None and self.per_client is not None and held[client] >= self.per_client:
            refused = AtCapacity(
                f"this client holds its quota of {self.per_client} MCP sessions; end one or retry later"
            )
            return self._busy(refused, [s for s in self.open.values() if s.client == client], now)
        return None

    def opened(self, session_id: str, client: str | None) -> None:
        self.open[session_id] = _Open(client, self._idle_for(episode=False))

    def begin(self, session_id: str) -> None:
        """A request of the session arrived: it does not lapse until the request ends."""
        if session_id in self.open:
            self.open[session_id].in_flight += 1

    def end(self, session_id: str, episode: bool) -> None:
        """A request of the session ended; whether the session now holds an episode."""
        session = self.open.get(session_id)
        if session is not None:
            # never below 0: a request can begin before the initialize that opened its
            # session is counted (the client has the answer a moment before this module)
            session.in_flight = max(0, session.in_flight - 1)
            session.seen, session.idle_s = time.monotonic(), self._idle_for(episode)

    def closed(self, session_id: str) -> None:
        self.open.pop(session_id, None)

    def lapsed(self) -> list[str]:
        """Forget the sessions idle past their timeout; their ids (a bare one is still
        open in the SDK, whose timeout is the full TTL, and is to be ended there)."""
        now = time.monotonic()
        gone = [key for key, session in self.open.items() if session.lapses_at(now) < now]
        for key in gone:
            del self.open[key]
        return gone

    def _idle_for(self, episode: bool) -> float:
        return self.idle_s if episode else min(self.bare_idle_s, self.idle_s)

    def _busy(self, refused: AtCapacity, sessions: list[_Open], now: float) -> JSONResponse:
        soonest = min((session.lapses_at(now) for session in sessions), default=now)
        wait = max(1, math.ceil(soonest - now))
        return jsonrpc_error(
            429,
            SERVER_BUSY,
            refused.message,
            refused.to_body() | {"retry_after": wait},
            {"Retry-After": str(wait)},
        )
