"""The HTTP/1.1 protocol every server here runs: uvicorn's httptools protocol (llhttp, a C
parser) for every request it can parse, and uvicorn's h11 protocol for the rest.

llhttp knows a fixed table of methods and refuses any other token (``FROB``) with a bare
400 before the app sees the request, where the wire API answers 405 ``method_not_allowed``
and counts it under ``method="other"``. h11 hands any token to the app but costs ~0.15 ms
more CPU per request, which on 2 cores comes out of the engines' share (bench/RESULTS.md,
issue 18). So a connection starts on httptools, and one whose request names a method
llhttp does not know is handed, bytes and all, to an h11 protocol, the way uvicorn hands a
connection to its WebSocket protocol on an upgrade.

uvicorn bounds neither a request's head nor the time it takes to arrive (64 MB of headers
were read; a body shorter than its Content-Length held its connection for ever), so this
protocol does: a head over :class:`RequestLimits` is refused with 431, and a request whose
head and body have not arrived within its timeout with 408, both in the wire API's error
envelope, and the connection is closed. A request's clock starts at its first byte; one
lazy timer per connection checks it (arming and cancelling a timer for every request, or
an ``asyncio.timeout`` in the app, would cost every request a few microseconds).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass

from uvicorn.protocols.http.h11_impl import H11Protocol

from agentgym.contract.errors import AgentGymError, HeadersTooLarge, RequestTimeout

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
except ImportError:  # httptools is a dependency; without it every connection is h11's
    HttpToolsProtocol = None


REQUEST_TIMEOUT_S = 30.0
"""Seconds a request (head and body) may take to arrive (408 after)."""


@dataclass(frozen=True)
class RequestLimits:
    """What a request head may hold and how long a request may take to arrive. An env
    server hands its own to the protocol in its lifespan state (``LIMITS_STATE``); any
    other app (the gateway) gets these defaults."""

    max_head_bytes: int = 16 * 1024
    """Request line and header fields, in bytes."""
    max_header_fields: int = 100
    timeout: float = REQUEST_TIMEOUT_S
    """Seconds from a request's first byte to its last; also the most a new connection
    may wait before sending one."""


LIMITS_STATE = "agentgym.request_limits"


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a refused request (httptools raises
    its HttpParserCallbackError with this as the context)."""

    def __init__(self, error: AgentGymError) -> None:
        super().__init__(error.message)
        self.error = error


def http_protocol() -> type | str:
    """uvicorn's ``http`` setting for our servers."""
    return "h11" if HttpToolsProtocol is None else MethodTolerantHttpTools


if HttpToolsProtocol is not None:

    class MethodTolerantHttpTools(HttpToolsProtocol):
        """httptools, falling back to h11 for a request with a method llhttp refuses.

        The fallback needs the refused request's bytes from its first one: they are known
        while every request before it on the connection has been answered and ended at a
        chunk boundary (what every real client does; a pipelined burst keeps the bare 400)."""

        def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
            super().connection_made(transport)
            self._unparsed_method: bytearray | None = bytearray()
            """The bytes since the last whole request while its method is not yet parsed;
            None once it is, or when a request began mid-chunk (its start is unknown)."""
            self._between_requests = True
            self._limits: RequestLimits = self.app_state.get(LIMITS_STATE, RequestLimits())
            self._arriving: str | None = "connection"
            """What is awaited: a first request ("connection"), a request's "head" or
            "body"; None between requests (uvicorn's keep-alive timeout's time)."""
            self._head_began_in_chunk = False
            self._head_bytes = self._head_fields = self._head_chunks = 0
            self._timer: asyncio.TimerHandle | None = None
            self._start_clock()  # a connection that never sends a request is closed too

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_clock()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._completed_in_chunk = self._head_began_in_chunk = False
            if self._unparsed_method is not None:
                self._unparsed_method += data
            super().data_received(data)  # calls send_400_response on a parse error
            if self._between_requests:
                self._unparsed_method = bytearray()
            elif self._completed_in_chunk:
                self._unparsed_method = None
            if self._arriving == "head" and not self._head_began_in_chunk and not self.transport.is_closing():
                # httptools buffers a header until it ends, so on_header alone cannot bound
                # memory: a chunk that is all head counts whole. (The chunk a head began in
                # may end a pipelined request too: its head part is left to on_header.)
                self._head_chunks += len(data)
                if self._head_chunks > self._limits.max_head_bytes:
                    self._refuse(self._too_large())

        def on_message_begin(self) -> None:
            self._between_requests = False
            self._arriving, self._head_began_in_chunk = "head", True
            self._head_bytes = self._head_fields = self._head_chunks = 0
            self._start_clock()
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._unparsed_method = None  # llhttp parses the method before the URL
            self._head_bytes += len(url)
            if self._head_bytes > self._limits.max_head_bytes:
                raise _Refused(self._too_large())
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_bytes += len(name) + len(value)
            self._head_fields += 1
            limits = self._limits
            if self._head_bytes > limits.max_head_bytes or self._head_fields > limits.max_header_fields:
                raise _Refused(self._too_large())
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._arriving = "body"
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._between_requests, self._completed_in_chunk = True, True
            self._arriving = None
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            self._stop_clock()  # the connection is the WebSocket protocol's now
            super().handle_websocket_upgrade()

        def send_400_response(self, msg: str) -> None:
            refused = sys.exc_info()[1]  # called from data_received's handler of the parse error
            if isinstance(getattr(refused, "__context__", None), _Refused):
                self._refuse(refused.__context__.error)  # type: ignore[union-attr]
                return
            in_flight = self.cycle is not None and not self.cycle.response_complete
            if (
                isinstance(refused, httptools.HttpParserInvalidMethodError)
                and self._unparsed_method is not None
                and not in_flight
            ):
                self._hand_to_h11(bytes(self._unparsed_method))
            else:
                super().send_400_response(msg)

        def _too_large(self) -> HeadersTooLarge:
            limits = self._limits
            return HeadersTooLarge(
                f"the request head exceeds {limits.max_head_bytes} bytes or {limits.max_header_fields} fields"
            )

        def _start_clock(self) -> None:
            """Give what is awaited ``timeout`` seconds from now."""
            self._deadline = self.loop.time() + self._limits.timeout
            if self._timer is None:
                self._timer = self.loop.call_at(self._deadline, self._check_clock)

        def _stop_clock(self) -> None:
            self._arriving = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _check_clock(self) -> None:
            self._timer = None
            if self._arriving is None:
                return  # no request arriving: the clock starts again with the next one
            earlier = self._arriving == "head" and self.cycle is not None and not self.cycle.response_complete
            if self.pipeline or earlier:
                self._start_clock()  # an earlier request is still being answered: the wait is ours
            elif self.loop.time() < self._deadline:
                self._timer = self.loop.call_at(self._deadline, self._check_clock)
            elif self._arriving == "connection":
                self.transport.close()
            else:
                self._refuse(RequestTimeout(f"the request did not arrive within {self._limits.timeout:g}s"))

        def _refuse(self, error: AgentGymError) -> None:
            """Answer ``error`` in the wire API's envelope and close the connection. Where
            an answer has begun (the app answered a request whose body is still coming, or
            an earlier request's), another would corrupt it: the connection is only closed.
            The app, if waiting for the body, gets a disconnect."""
            arriving = self._arriving
            self._stop_clock()
            in_head = arriving == "head" and (self.cycle is None or self.cycle.response_complete)
            if in_head or (arriving == "body" and not self.cycle.response_started):
                body = json.dumps(error.to_body()).encode()
                self.transport.write(
                    STATUS_LINE[error.status]
                    + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                    % (len(body), body)
                )
            self.transport.close()

        def _hand_to_h11(self, data: bytes) -> None:
            self._stop_clock()  # the request is h11's now
            self.connections.discard(self)
            protocol = H11Protocol(
                config=self.config, server_state=self.server_state, app_state=self.app_state
            )
            self.transport.set_protocol(protocol)
            protocol.connection_made(self.transport)
            # One request only, answered with "connection: close": the head and time limits
            # are this protocol's, so a client must not keep an unlimited h11 connection by
            # opening it with an unknown method (h11 has no public switch for this).
            protocol.conn._cstate.process_keep_alive_disabled()
            protocol.data_received(data)
