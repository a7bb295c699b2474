"""The HTTP/1.1 protocol every server here runs: uvicorn's httptools protocol (llhttp, a C
parser) for every request it can parse, and uvicorn's h11 protocol for the rest.

llhttp knows a fixed table of methods and refuses any other token (``FROB``) with a bare
400 before the app sees the request, where the wire API answers 405 ``method_not_allowed``
and counts it under ``method="other"``. h11 hands any token to the app but costs ~0.15 ms
more CPU per request, which on 2 cores comes out of the engines' share (bench/RESULTS.md,
issue 18). So a connection starts on httptools, and one whose request names a method
llhttp does not know is handed, bytes and all, to an h11 protocol, the way uvicorn hands a
connection to its WebSocket protocol on an upgrade.
"""

from __future__ import annotations

import sys

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is a dependency; without it every connection is h11's
    HttpToolsProtocol = None


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
