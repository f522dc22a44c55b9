"""Read timeouts for ``mvdb serve``'s HTTP connections, which uvicorn does not have: a connection
must deliver a request's headers within ``header_timeout_s`` of its first byte (or of the
connection opening), and its whole body within ``body_timeout_s`` of the headers. Past either, the
server answers 408 with the library's error shape (``{"error": "InvalidInputError", "message": ...}``)
and closes the connection, so that slow or stalled clients cannot hold connections forever.

Built on uvicorn's httptools protocol (mvdb's ``serve`` extra installs httptools): the timers
hang on its parser callbacks, which follow httptools' fixed callback names.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _response_408(message: str) -> bytes:
    body = json.dumps({"error": "InvalidInputError", "message": message}).encode()
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head + body


def timed_protocol(header_timeout_s: float, body_timeout_s: float) -> type:
    """An httptools protocol class for uvicorn's ``http=`` with these read timeouts."""

    class TimedHttpToolsProtocol(HttpToolsProtocol):
        _timer = None

        def _arm(self, seconds: float, what: str) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._expired, what, seconds)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self, what: str, seconds: float) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            cycle = getattr(self, "cycle", None)
            if cycle is None or not getattr(cycle, "response_started", False):
                self.transport.write(_response_408(
                    f"request {what}: not received within {seconds:g} s (mvdb serve --{what}-timeout)"))
            self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm(header_timeout_s, "header")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(header_timeout_s, "header")

        def on_headers_complete(self) -> None:
            self._arm(body_timeout_s, "body")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return TimedHttpToolsProtocol
