"""The viewer's HTTP connections, bounded: how many are open, and how long a request may
take to arrive.

uvicorn's HTTP/1.1 protocol keeps a connection that never completes a request open forever
(its keep-alive timeout starts only after a response), so a client opening thousands of
idle or slow connections exhausts the process's file descriptors; the server then stops
answering and asyncio logs a traceback per refused accept. `BoundedH11Protocol` closes a
connection at once when MAX_CONNECTIONS are already open, and closes one whose request
headers have not all arrived REQUEST_TIMEOUT_S seconds after it opened (or after its
previous response). `make_server` builds the uvicorn server that uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS: Final = 128
REQUEST_TIMEOUT_S: Final = 10.0


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection limit and a request-arrival timeout."""

    max_connections: int = MAX_CONNECTIONS
    request_timeout_s: float = REQUEST_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        over = len(self.connections) >= self.max_connections
        super().connection_made(transport)
        self._request_timer: asyncio.TimerHandle | None = None
        if over:
            transport.abort()  # no response: answering would cost what the limit saves
            return
        self._arm_request_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
            self._cancel_request_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_request_timer()  # the next request on this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_request_timer()
        super().connection_lost(exc)

    def _arm_request_timer(self) -> None:
        self._cancel_request_timer()
        self._request_timer = self.loop.call_later(self.request_timeout_s, self._request_late)

    def _cancel_request_timer(self) -> None:
        timer = getattr(self, "_request_timer", None)
        if timer is not None:
            timer.cancel()
            self._request_timer = None

    def _request_late(self) -> None:
        self._request_timer = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.transport.abort()


def make_server(
    app: Callable[..., Any],
    host: str,
    port: int,
    *,
    max_connections: int = MAX_CONNECTIONS,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` on ``host:port`` whose connections are bounded as the
    module says; ``server.run()`` serves until it is told to exit."""
    bounds = {"max_connections": max_connections, "request_timeout_s": request_timeout_s}
    protocol = type("ViewerH11Protocol", (BoundedH11Protocol,), bounds)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", http=protocol)
    return uvicorn.Server(config)
