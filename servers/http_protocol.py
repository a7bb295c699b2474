"""The HTTP/1.1 protocol every server here runs: uvicorn's httptools protocol (llhttp, a C
parser) for every request it can parse, and uvicorn's h11 protocol for the rest.

llhttp knows a fixed table of methods and refuses any other token (``FROB``) with a bare
400 before the app sees the request, where the wire API answers 405 ``method_not_allowed``
and counts it under ``method="other"``. h11 hands any token to the app but costs ~0.15 ms
more CPU per request, which on 2 cores comes out of the engines' share (bench/RESULTS.md,
issue 18). So a connection starts on httptools, and one whose request names a method
llhttp does not know is handed, bytes and all, to an h11 protocol, the way uvicorn hands a
connection to its WebSocket protocol on an upgrade.

uvicorn writes a response's status line and headers as soon as the app starts the
response, and the body as a second write: two ``send`` calls per response, and a client
that wakes up for each half. Here the head is held and goes out with the first body
chunk, so a small response (every step) is one write and one segment.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
except ImportError:  # httptools is a dependency; without it every connection is h11's
    HttpToolsProtocol = None


def http_protocol() -> type | str:
    """uvicorn's ``http`` setting for our servers."""
    return "h11" if HttpToolsProtocol is None else MethodTolerantHttpTools


class _HeldWrite:
    """Stands in for the transport while uvicorn writes a response's head: keeps the bytes."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class _PrefixedWrite:
    """The transport, with ``prefix`` put before the next write."""

    def __init__(self, transport: Any, prefix: bytes) -> None:
        self._transport, self._prefix = transport, prefix

    def write(self, data: bytes) -> None:
        prefix, self._prefix = self._prefix, b""
        self._transport.write(prefix + data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


if HttpToolsProtocol is not None:

    class OneWriteCycle(RequestResponseCycle):
        """uvicorn's request/response cycle, writing the response head with the first body
        chunk when the app sends it at once (every plain response does: no await in between
        suspends); otherwise (a stream waiting for its first chunk) the head goes out alone
        on the event loop's next turn. If the app fails in between, the connection is
        closed either way."""

        _head = b""
        _late_head: asyncio.Handle | None = None

        async def send(self, message: Any) -> None:
            transport = self.transport
            if message["type"] == "http.response.start" and not self.response_started:
                self.transport = held = _HeldWrite()
                try:
                    await super().send(message)
                finally:
                    self.transport, self._head = transport, held.data
                self._late_head = asyncio.get_running_loop().call_soon(self._write_head)
                return
            if self._head and message["type"] == "http.response.body":
                self._late_head.cancel()
                self.transport = _PrefixedWrite(transport, self._head)
                self._head = b""
                try:
                    await super().send(message)
                finally:
                    self.transport = transport
                return
            await super().send(message)

        def _write_head(self) -> None:
            head, self._head = self._head, b""
            if head and not self.transport.is_closing():
                self.transport.write(head)

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

        def data_received(self, data: bytes) -> None:
            self._completed_in_chunk = False
            if self._unparsed_method is not None:
                self._unparsed_method += data
            super().data_received(data)  # calls send_400_response on a parse error
            if self._between_requests:
                self._unparsed_method = bytearray()
            elif self._completed_in_chunk:
                self._unparsed_method = None

        def on_message_begin(self) -> None:
            self._between_requests = False
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._unparsed_method = None  # llhttp parses the method before the URL
            super().on_url(url)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            # The new cycle's ASGI task has not run yet, so it runs with OneWriteCycle.send.
            if type(self.cycle) is RequestResponseCycle:
                self.cycle.__class__ = OneWriteCycle

        def on_message_complete(self) -> None:
            self._between_requests, self._completed_in_chunk = True, True
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            refused = sys.exc_info()[1]  # called from data_received's handler of the parse error
            in_flight = self.cycle is not None and not self.cycle.response_complete
            if (
                isinstance(refused, httptools.HttpParserInvalidMethodError)
                and self._unparsed_method is not None
                and not in_flight
            ):
                self._hand_to_h11(bytes(self._unparsed_method))
            else:
                super().send_400_response(msg)

        def _hand_to_h11(self, data: bytes) -> None:
            self.connections.discard(self)
            protocol = H11Protocol(
                config=self.config, server_state=self.server_state, app_state=self.app_state
            )
            self.transport.set_protocol(protocol)
            protocol.connection_made(self.transport)
            protocol.data_received(data)
