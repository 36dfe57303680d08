"""The lookup API's front door: every phase of a connection bounded, every refusal JSON.

aiohttp bounds header sizes and closes idle keep-alive connections, but nothing else: a client
that opens connections and sends nothing, sends its headers a byte at a time, or declares a
body it never sends holds a connection (and a file descriptor) as long as it likes. Here:

- `Limits`: the bounds, from the settings (docs/serving.md, "Limits").
- `GuardedHandler`: aiohttp's per-connection protocol with a header deadline (the request line
  and headers must have arrived `header_timeout_s` after the connection opened), a count of
  requests served, and aiohttp's own parser errors (bad request line, oversized headers)
  answered as JSON like every other error.
- `Guard`: the connections of one server, oldest first. At `max_connections` a new connection
  closes the oldest one with no request in progress (a silent or slow client's, or an idle
  keep-alive one); when every connection has a request in progress, the new one gets a 503.
  Open file descriptors stay below the cap, far from the process's limit, so the worker's
  RocksDB files and Kafka connections always have room.
- `Acceptor`: accepts the connections itself and stops accepting while `Guard.budget` sockets
  are open (the cap, plus refused connections lingering and ones just accepted), so that a
  storm of clients cannot fill the process's file table however slowly its loop turns.
- `GuardedSite`: serves an aiohttp `AppRunner` through those on a bound socket (TLS optional).

The body's deadline and size are enforced where it is read (`streams.lookup.api`).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import socket
import ssl
import struct
import termios
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from streams.lookup.metrics import Family
from streams.settings import API_CONNECTIONS_AT_MOST, APP_HEADER, Settings, default

log = logging.getLogger("oracular.api")

MAX_LINE_BYTES: Final = 8190
"""Longest request line or header line (aiohttp's default)."""
MAX_HEADERS: Final = 64
"""Most header lines in one request."""
EVICT_IDLE_S: Final = 0.5
"""At the connection cap, only a connection idle this long (no request since it opened or
since its last answer) is closed to make room: a burst of clients is accepted before their
requests are read, and those must not be taken for silent ones."""
EVICT_PARTIAL_S: Final = 2.0
"""The same for a connection that has sent part of a request (a slow client, or a request
the worker has not yet read on a busy machine)."""
LINGER_S: Final = 1.0
"""After answering a request whose body was not read (401, 413), unread body bytes are
discarded for at most this long before the connection closes (aiohttp's default: 10 s)."""
ACCEPT_BATCH: Final = 16
"""Connections accepted per turn of the API's event loop (asyncio's own server: its backlog)."""
REFUSED_LINGER_S: Final = 0.25
"""A refused connection (503 at the cap) discards what its client sends for at most this long
before it closes (its request is usually on its way: closing at once would reset it)."""


CLOSE_REASONS: Final = ("header_timeout", "write_timeout", "evicted", "refused")
"""Why the guard closes a connection: its headers were late; its client did not read an
answer within the body deadline; the cap was reached and it was the least recently active
idle one; the cap was reached with none to close (a 503)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """How long each phase of a request may take and how much a client may hold."""

    header_timeout_s: float = default("api_header_timeout_s")
    body_timeout_s: float = default("api_body_timeout_s")
    keepalive_s: float = default("api_keepalive_s")
    max_requests: int = default("api_max_requests_per_connection")
    max_connections: int = API_CONNECTIONS_AT_MOST
    max_body_bytes: int = default("api_max_body_bytes")

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            header_timeout_s=settings.api_header_timeout_s,
            body_timeout_s=settings.api_body_timeout_s,
            keepalive_s=settings.api_keepalive_s,
            max_requests=settings.api_max_requests_per_connection,
            max_connections=settings.api_connections,
            max_body_bytes=settings.api_max_body_bytes,
        )


def json_error(status: int, message: str, **extra: Any) -> web.Response:
    """A JSON error answer (`{"error", "status", ...}`) that closes the connection."""
    body = {"error": message, "status": status, **extra}
    response = web.Response(
        text=json.dumps(body, separators=(",", ":")),
        status=status,
        content_type="application/json",
    )
    response.force_close()
    return response


def internal_error(what: str, exc: BaseException | None) -> web.Response:
    """A 500 that says only "internal error" and an id; the id and the traceback are logged."""
    error_id = uuid.uuid4().hex[:12]
    log.error("lookup API: internal error %s in %s", error_id, what, exc_info=exc)
    return json_error(500, "internal error", id=error_id)


_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n%s: %s\r\nContent-Length: %d\r\n\r\n%s"
)
_REFUSED_BODY: Final = (
    b'{"error":"too many connections with a request in progress; retry","status":503}'
)


def unread_bytes(transport: asyncio.BaseTransport | None) -> int:
    """Bytes waiting in the kernel for the connection (FIONREAD); 0 when unknown."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", raw)[0])


class GuardedHandler(RequestHandler):
    """aiohttp's connection protocol, bounded by a `Guard`."""

    def __init__(
        self,
        manager: web.Server,
        guard: Guard,
        *,
        release: Callable[[], None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.release = release
        """Tells the `Acceptor` that this connection's socket is closed."""
        self.served = 0
        """Requests this connection has begun (their headers complete)."""
        self.busy = False
        """A request is in progress (headers complete, not yet answered)."""
        self.idle_since = time.monotonic()
        """When it opened or last answered a request (the guard evicts long-idle ones)."""
        self.heard = False
        """Bytes came since then (a request on its way, or a slow one)."""
        self.deadline: asyncio.TimerHandle | None = None
        self.refused: asyncio.Transport | None = None
        """Set when the guard refused the connection: it only says so, then closes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.guard.admit(self):
            self._refuse(cast("asyncio.Transport", transport))
            return
        super().connection_made(transport)
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(self.guard.limits.header_timeout_s, self._headers_due)

    def _refuse(self, transport: asyncio.Transport) -> None:
        """A 503 without starting aiohttp's handling. The client's request may be in flight:
        half-close and discard what arrives for a moment, so it reads the 503 instead of a
        reset; at once when a quarter of the cap linger already, so that admitted, lingering
        and just-accepted connections together stay well below the open-file limit)."""
        self.refused = transport
        body, app = _REFUSED_BODY, self.guard.app_id.encode("ascii", "replace")
        transport.write(_REFUSED % (APP_HEADER.encode(), app, len(body), body))
        if self.guard.lingering >= max(1, self.guard.limits.max_connections // 4):
            transport.close()
            return
        self.guard.lingering += 1
        if transport.can_write_eof():
            transport.write_eof()
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self.refused is None:
            self.heard = True
            super().data_received(data)

    def evictable(self, now: float) -> bool:
        """May the guard close it to make room? Only when it has no request in progress,
        has been idle EVICT_IDLE_S (EVICT_PARTIAL_S if part of a request came), and has no
        bytes waiting unread (a busy worker may read a request late: it is not silent)."""
        if self.busy:
            return False
        idle = now - self.idle_since
        if idle < (EVICT_PARTIAL_S if self.heard else EVICT_IDLE_S):
            return False
        return unread_bytes(self.transport) == 0

    def eof_received(self) -> None:
        if self.refused is not None:
            self.refused.close()
            return
        super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.release()
        if self.refused is not None:  # aiohttp never knew it
            self.refused = None
            self.guard.lingering -= 1
            return
        self.guard.forget(self)
        super().connection_lost(exc)

    def _headers_due(self) -> None:
        self.deadline = None
        if self.served == 0 and self.transport is not None:
            self.guard.closed["header_timeout"] += 1
            self.force_close()

    def begin(self) -> None:
        """A request's headers are complete: it is being answered."""
        self.served += 1
        self.busy = True

    def end(self) -> bool:
        """Its answer is made; True when the connection must close after it (its request
        limit is reached)."""
        self.busy = False
        self.idle_since = time.monotonic()
        self.heard = False
        self.guard.touch(self)
        return self.served >= self.guard.limits.max_requests

    async def finish_response(
        self, request: Any, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        """Write the answer within the body deadline: a client that does not read its
        answers (pipelining requests and never reading) is closed, not waited for."""
        try:
            async with asyncio.timeout(self.guard.limits.body_timeout_s):
                return await super().finish_response(request, resp, start_time)
        except TimeoutError:
            self.guard.closed["write_timeout"] += 1
            self.force_close()
            return resp, True

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's own errors (a request it cannot parse, a handler that failed outside the
        API's middleware) as JSON, never a traceback in the answer."""
        if request.writer.output_size > 0:
            msg = "the answer is partly sent: no error answer possible"
            raise ConnectionError(msg)
        if status >= 500:
            response = internal_error(f"{request.method} {request.path}", exc)
        else:
            detail = message or getattr(exc, "message", None) or str(exc or "") or "bad request"
            detail = (detail.strip().splitlines() or ["bad request"])[0][:200]
            log.debug("lookup API: malformed request (%s): %s", status, detail)
            response = json_error(status, f"malformed HTTP request: {detail}")
        response.headers[APP_HEADER] = self.guard.app_id
        return response


class Guard:
    """The open connections of one API server, oldest first, and why any were closed."""

    def __init__(self, limits: Limits, app_id: str = "oracular") -> None:
        self.limits = limits
        self.app_id = app_id
        """Said on the answers the guard makes itself (APP_HEADER)."""
        self.connections: dict[GuardedHandler, None] = {}
        """Insertion order: least recently active first (`touch` moves one to the end)."""
        self.closed: Counter[str] = Counter()
        """Connections closed or refused by the guard, by reason."""
        self.lingering = 0
        """Refused connections still open (answered 503, discarding what the client sends)."""
        self.acceptor: Acceptor | None = None
        """Set when serving: it holds every accepted socket until it closes."""

    @property
    def budget(self) -> int:
        """Sockets open at most: the cap's connections, a quarter more refused ones
        lingering, and a quarter more accepted and not yet admitted, refused or closed."""
        return self.limits.max_connections + 2 * max(1, self.limits.max_connections // 4)

    def admit(self, conn: GuardedHandler) -> bool:
        """Take a new connection: at the cap, close the least recently active one that may be
        (`GuardedHandler.evictable`); False (refuse it) when there is none: every connection
        has a request in progress or on its way (a burst of clients)."""
        if len(self.connections) >= self.limits.max_connections:
            now = time.monotonic()
            oldest = next((c for c in self.connections if c.evictable(now)), None)
            if oldest is None:
                self.closed["refused"] += 1
                return False
            self.connections.pop(oldest)
            self.closed["evicted"] += 1
            oldest.force_close()
        self.connections[conn] = None
        return True

    def touch(self, conn: GuardedHandler) -> None:
        """`conn` just answered a request: it is the most recently active."""
        if conn in self.connections:
            self.connections.pop(conn)
            self.connections[conn] = None

    def forget(self, conn: GuardedHandler) -> None:
        self.connections.pop(conn, None)

    def families(self) -> list[Family]:
        """`/metrics`: open connections and those the guard closed, by reason."""
        closed = Family(
            "oracular_api_connections_closed_total",
            "counter",
            "API connections closed or refused by the guard, by reason.",
        )
        for reason in CLOSE_REASONS:
            closed.add(self.closed[reason], (("reason", reason),))
        sockets = self.acceptor.open if self.acceptor is not None else len(self.connections)
        return [
            Family("oracular_api_connections", "gauge", "Open API connections.").add(
                len(self.connections)
            ),
            Family(
                "oracular_api_sockets",
                "gauge",
                "Open API sockets: connections, refused ones lingering, ones being accepted.",
            ).add(sockets),
            closed,
        ]


class Acceptor(asyncio.AbstractServer):
    """Accepts the listening socket's connections itself, so that at most `budget` of them
    are open at any time: at the budget it stops accepting (they wait in the kernel's listen
    queue, not in this process's file table) and resumes as connections close.

    asyncio's own server accepts up to its backlog on every turn of the loop and hands each
    to a task: on a starved loop, accepted sockets waiting for their turn pile up with no
    bound (2,000 clients at once took a worker limited to 1,024 files to its limit)."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[Callable[[], None]], asyncio.Protocol],
        *,
        budget: int,
        ssl_context: ssl.SSLContext | None,
        handshake_timeout_s: float,
    ) -> None:
        self.sock = sock
        self.factory = factory
        """Builds a connection's protocol from its release callback (call once it closed)."""
        self.budget = budget
        self.open = 0
        """Accepted connections not yet closed (their protocol's `connection_lost`)."""
        self.most = 0
        """The most open at once (a test reads it)."""
        self.ssl_context = ssl_context
        self.handshake_timeout_s = handshake_timeout_s
        self.loop = asyncio.get_running_loop()
        self.reading = False
        self.closed = False
        self.tasks: set[asyncio.Task[Any]] = set()
        sock.setblocking(False)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self.closed else (self.sock,)

    def _resume(self) -> None:
        if not self.reading and not self.closed and self.open < self.budget:
            self.loop.add_reader(self.sock.fileno(), self._acceptable)
            self.reading = True

    def _pause(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.sock.fileno())
            self.reading = False

    def _acceptable(self) -> None:
        for _ in range(ACCEPT_BATCH):  # a turn of the loop takes a few, then lets others run
            if self.open >= self.budget:
                self._pause()
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of files or buffers, or the client gave up first
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("lookup API: cannot accept a connection (%s); retrying in 1 s", exc)
                    self._pause()
                    self.loop.call_later(1.0, self._resume)
                    return
                continue
            conn.setblocking(False)
            self.open += 1
            self.most = max(self.most, self.open)
            task = self.loop.create_task(self._connect(conn, _Once(self._released)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _connect(self, conn: socket.socket, release: Callable[[], None]) -> None:
        tls: dict[str, Any] = {}
        if self.ssl_context is not None:  # the TLS handshake is part of the header deadline
            tls = {"ssl": self.ssl_context, "ssl_handshake_timeout": self.handshake_timeout_s}
        try:
            await self.loop.connect_accepted_socket(lambda: self.factory(release), conn, **tls)
        except (OSError, TimeoutError, ssl.SSLError, asyncio.CancelledError) as exc:
            log.debug("lookup API: a connection failed before its first byte: %r", exc)
            conn.close()
            release()

    def _released(self) -> None:
        self.open -= 1
        self._resume()

    def close(self) -> None:
        self._pause()
        if not self.closed:
            self.closed = True
            self.sock.close()
        for task in self.tasks:
            task.cancel()

    async def wait_closed(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.loop

    def is_serving(self) -> bool:
        return self.reading or (not self.closed and self.open >= self.budget)

    async def start_serving(self) -> None:
        self._resume()

    async def serve_forever(self) -> None:
        self._resume()
        await asyncio.Future()


class _Once:
    """A callback that runs at most once (a connection is released once, however it ends)."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Callable[[], None] | None = callback

    def __call__(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class GuardedSite(web.SockSite):
    """An aiohttp site on a bound socket whose connections a `Guard` bounds."""

    def __init__(
        self,
        runner: web.AppRunner,
        sock: Any,
        guard: Guard,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context)
        self.guard = guard

    async def start(self) -> None:
        self._runner._reg_site(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None, "runner.setup() first"
        limits = self.guard.limits

        def connection(release: Callable[[], None]) -> GuardedHandler:
            return GuardedHandler(
                server,
                self.guard,
                release=release,
                loop=loop,
                keepalive_timeout=limits.keepalive_s,
                lingering_time=min(LINGER_S, limits.body_timeout_s),
                max_line_size=MAX_LINE_BYTES,
                max_field_size=MAX_LINE_BYTES,
                max_headers=MAX_HEADERS,
                access_log=None,
            )

        acceptor = Acceptor(
            self._sock,
            connection,
            budget=self.guard.budget,
            ssl_context=self._ssl_context,
            handshake_timeout_s=limits.header_timeout_s,
        )
        self.guard.acceptor = acceptor
        self._server = acceptor
        await acceptor.start_serving()


async def serve(
    web_app: web.Application,
    sock: Any,
    limits: Limits,
    *,
    ssl_context: ssl.SSLContext | None = None,
    app_id: str = "oracular",
) -> tuple[web.AppRunner, Guard]:
    """Serve `web_app` on the bound socket `sock` through a `Guard` (on the running loop);
    `runner.cleanup()` stops it."""
    runner = web.AppRunner(web_app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    guard = Guard(limits, app_id)
    await GuardedSite(runner, sock, guard, ssl_context=ssl_context).start()
    return runner, guard
