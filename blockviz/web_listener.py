"""blockviz serve's listener: aiohttp's TCPSite, with its connections bounded in number and in
how long each may take to send a request header.

aiohttp closes a connection that sends no whole request only after its keep-alive timeout (75 s
under textual-serve's `run_app`), so about a thousand connections that send part of a header
and wait (nothing a LAN cannot do) held every file the server may open, and the server exited
(a log record's traceback needed a file too). Here each connection must send a whole header
within HEADER_TIMEOUT_S, at most MAX_CONNECTIONS are open (fewer when files are scarce), and a
new one beyond that pushes out the one that has waited longest without a request, so a visitor
still gets the page (docs/serve.md, "Security").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import time
from typing import Any, Callable

from aiohttp import web

log = logging.getLogger("blockviz.serve")
HEADER_TIMEOUT_S = 10  # from connecting (or the end of the last request) to a whole request header
MAX_CONNECTIONS = 512  # open at once, and fewer when open files are scarce (connection_limit)
FDS_PER_VISITOR = 4  # the websocket and the app's stdin, stdout, stderr pipes
RESERVED_FDS = 64  # the server's own files: Python's, the listener's, the static files it sends


class ConnectionGuard:
    """The listener's protocol factory, around aiohttp's (`web.Server`): at most `max_connections`
    open at once, and each one closed when it has not sent a whole request header within
    `header_timeout_s` of connecting or of its last request's end (half-open connections would
    otherwise hold a file each until the server has none left). A connection beyond the limit
    closes the one that has waited longest without a request; when every one is in a request
    (a visitor's websocket), it is closed at once."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], max_connections: int, header_timeout_s: float) -> None:
        self.factory = factory
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.connections: dict[Any, GuardedConnection] = {}  # by transport
        self.waiting: dict[GuardedConnection, asyncio.TimerHandle] = {}  # no request yet, longest first
        self.num_dropped = 0
        self._last_logged = -float("inf")

    def __call__(self) -> GuardedConnection:
        return GuardedConnection(self)

    def admit(self, connection: GuardedConnection) -> bool:
        """Whether a new connection may open, closing the longest-waiting one to make room."""
        if len(self.connections) >= self.max_connections:
            self._dropped("open connections at the limit")
            if not self.waiting:
                return False
            self._close(next(iter(self.waiting)))
        self.connections[connection.transport] = connection
        self._wait(connection)
        return True

    def forget(self, connection: GuardedConnection) -> None:
        self._stop_waiting(connection)
        if self.connections.get(connection.transport) is connection:
            del self.connections[connection.transport]

    def request_started(self, transport: Any) -> None:
        if transport in self.connections:
            self._stop_waiting(self.connections[transport])

    def request_ended(self, transport: Any) -> None:
        if transport in self.connections:
            self._wait(self.connections[transport])

    def _wait(self, connection: GuardedConnection) -> None:
        self._stop_waiting(connection)
        loop = asyncio.get_running_loop()
        self.waiting[connection] = loop.call_later(self.header_timeout_s, self._timed_out, connection)

    def _stop_waiting(self, connection: GuardedConnection) -> None:
        timer = self.waiting.pop(connection, None)
        if timer is not None:
            timer.cancel()

    def _timed_out(self, connection: GuardedConnection) -> None:
        self._dropped(f"no request header within {self.header_timeout_s:g} s")
        self._close(connection)

    def _close(self, connection: GuardedConnection) -> None:
        self.forget(connection)
        connection.transport.abort()

    def _dropped(self, why: str) -> None:
        """Count a connection closed by the guard; one log line a minute at most."""
        self.num_dropped += 1
        now = time.monotonic()
        if now - self._last_logged >= 60:
            self._last_logged = now
            log.warning("closing connections (%s; %d so far)", why, self.num_dropped)


class GuardedConnection(asyncio.Protocol):
    """One connection: aiohttp's RequestHandler, once the ConnectionGuard has admitted it."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self.transport: Any = None
        self.handler: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if not self.guard.admit(self):
            transport.abort()
            return
        self.handler = self.guard.factory()
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite (SO_REUSEADDR, as check_port_free binds) with its connections guarded."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        self._server = await asyncio.get_running_loop().create_server(
            self._guard, self._host, self._port, backlog=self._backlog, reuse_address=True)


def connection_limit(max_visitors: int) -> int:
    """MAX_CONNECTIONS, or fewer when this process may not open enough files for them besides its
    visitors' (raising its soft limit to the hard one first): the server must never run out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(min(MAX_CONNECTIONS, soft - RESERVED_FDS - FDS_PER_VISITOR * max_visitors), max_visitors + 8)


def log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's exception handler as one log line: out of files, asyncio stops accepting for a
    moment and tries again, which is no reason for a traceback (nor for importing one)."""
    error = context.get("exception")
    if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
        log.warning("out of open files: new connections wait (%s)", error.strerror)
        return
    log.error("%s%s", context.get("message", "error"), f": {error!r}" if error else "")
