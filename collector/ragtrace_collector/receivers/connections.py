"""Connection limits for the OTLP/HTTP receiver: slow clients and too many of them.

aiohttp closes idle keep-alive connections (``keepalive_timeout``) but has no notion of
a deadline for the request head, and no connection cap.  :class:`ConnectionGuard`
adds both around aiohttp's protocol factory (the ``web.Server`` of an ``AppRunner``);
the receiver listens with ``loop.create_server(guard.protocol_factory, ...)``:

* **header deadline**: a connection that has not delivered a complete request head
  within ``read_header_timeout`` of being accepted is closed (slowloris, idle
  sockets).  The receiver's handler calls :meth:`ConnectionGuard.request_started`,
  which disarms it.  Later requests on a kept-alive connection are bounded by
  aiohttp's ``keepalive_timeout``, which closes a connection waiting for its next
  request head;
* **cap**: at most ``max_connections`` connections at once; one more is answered
  ``503 Service Unavailable`` with ``Retry-After`` and closed at once, so the client
  learns why and when to retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from ragtrace_collector.component.logs import get_logger

__all__ = ["ConnectionGuard"]

_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: 35\r\n"
    b"\r\n"
    b"too many connections; retry later\r\n"
)


class _Connection(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection; forwards every event to it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = False

    # ------------------------------------------------------------- protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._guard._admit(self):
            transport.write(_BUSY)
            transport.close()
            return
        self._admitted = True
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.header_timeout, self._header_deadline)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._admitted:
            self._admitted = False
            self._guard._release(self)
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()

    # ------------------------------------------------------------- deadline
    def request_started(self) -> None:
        self._disarm()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_deadline(self) -> None:
        self._timer = None
        self._guard._timed_out()
        if self._transport is not None:
            self._transport.close()


class ConnectionGuard:
    """Counts connections, refuses those over the cap, closes those too slow to start."""

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        header_timeout: float,
        max_connections: int,
        name: str,
        rejected: Callable[[str], None] | None = None,
    ) -> None:
        self._factory = factory
        self._rejected = rejected
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self._by_inner: dict[int, _Connection] = {}
        self._log = get_logger("receiver").bind(receiver=name)
        self._refusing = False
        #: Connections refused over the cap, and closed at the header deadline (each is
        #: also passed to ``rejected`` as ``too_many_connections`` / ``header_timeout``).
        self.refused = 0
        self.timed_out = 0

    @property
    def open_connections(self) -> int:
        return len(self._by_inner)

    def protocol_factory(self) -> asyncio.Protocol:
        inner = self._factory()
        return _Connection(self, inner)

    def request_started(self, protocol: object) -> None:
        """Called by the request handler with ``request.protocol``: the head is in."""
        connection = self._by_inner.get(id(protocol))
        if connection is not None:
            connection.request_started()

    # ------------------------------------------------------------- internal
    def _admit(self, connection: _Connection) -> bool:
        if len(self._by_inner) >= self.max_connections:
            self.refused += 1
            if self._rejected is not None:
                self._rejected("too_many_connections")
            if not self._refusing:
                self._refusing = True
                self._log.warning("connection_limit_reached", max_connections=self.max_connections)
            return False
        if self._refusing:
            self._refusing = False
            self._log.info("connection_limit_cleared", open_connections=len(self._by_inner))
        self._by_inner[id(connection._inner)] = connection
        return True

    def _release(self, connection: _Connection) -> None:
        self._by_inner.pop(id(connection._inner), None)

    def _timed_out(self) -> None:
        self.timed_out += 1
        if self._rejected is not None:
            self._rejected("header_timeout")
        self._log.debug("connection_header_timeout", timeout_s=self.header_timeout)
