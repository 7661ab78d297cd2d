"""The one HTTP port (spec §3.1): aiohttp application, error middleware, limits.

Components (bus, pub/sub, mesh, node status) contribute routes; this module turns
every :class:`WireError` into the JSON error body of spec §2.2 with its status, counts
every refusal, and turns anything unexpected into ``internal_error`` without taking
the node down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    InternalError,
    NotFound,
    PayloadTooLarge,
    WireError,
)
from hearthnet.metrics import Counter, MetricsRegistry
from hearthnet.transport.websocket import MAX_HEAD_BYTES, RequestHead, parse_head

log = logging.getLogger("hearthnet.transport")

# aiohttp's own parser limits sit above ours so oversized headers reach our middleware,
# where they are answered in JSON and counted; only absurd input is cut by aiohttp.
_PARSER_LIMIT = 64 * 1024


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON response encoded with orjson."""
    return web.Response(
        body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers
    )


def error_response(error: WireError, headers: dict[str, str] | None = None) -> web.Response:
    """The spec §2.2 error body with the code's HTTP status (and Retry-After when known)."""
    all_headers = dict(headers or {})
    if error.retry_after_ms is not None:
        all_headers["Retry-After"] = str(max(1, (error.retry_after_ms + 999) // 1000))
    return json_response(error.to_wire(), error.http_status, all_headers)


@dataclass(slots=True)
class TransportMetrics:
    """Refusals and WebSocket ends, for ``/metrics``."""

    refused: Counter
    ws_closed: Counter
    abandoned: Counter
    ignored_acks: Counter

    @classmethod
    def register(cls, registry: MetricsRegistry) -> TransportMetrics:
        """Create the series on ``registry``."""
        return cls(
            refused=registry.counter(
                "hearthnet_requests_refused_total",
                "Requests and frames refused, by wire error code.",
                ("code", "transport"),
            ),
            ws_closed=registry.counter(
                "hearthnet_ws_closed_total",
                "WebSocket connections closed, by close code.",
                ("code",),
            ),
            abandoned=registry.counter(
                "hearthnet_streams_abandoned_total",
                "Streams whose client went away before the end.",
                ("transport",),
            ),
            ignored_acks=registry.counter(
                "hearthnet_ws_ignored_acks_total", "Acks for old or unknown seqs (no-ops)."
            ),
        )


class ConnectionTracker:
    """Open streams and sockets per identity and per node (spec §2.5). Pure."""

    def __init__(self, per_identity: int, total: int, refused: Counter | None = None) -> None:
        self.per_identity = per_identity
        self.total_limit = total
        self.by_identity: dict[str, int] = {}
        self.total = 0
        self.refused = refused or Counter("refused", "", ("limit",))

    @property
    def full(self) -> bool:
        """True when the node is at its connection limit."""
        return self.total >= self.total_limit

    def open(self, identity: str) -> None:
        """Count one more connection for ``identity``.

        Raises:
            CapacityExceeded: over the per-identity or per-node limit.
        """
        if self.total >= self.total_limit:
            self.refused.inc("node")
            raise CapacityExceeded("node connection limit reached", retry_after_ms=1000)
        used = self.by_identity.get(identity, 0)
        if used >= self.per_identity:
            self.refused.inc("identity")
            raise CapacityExceeded(
                f"at most {self.per_identity} connections per identity", retry_after_ms=1000
            )
        self.by_identity[identity] = used + 1
        self.total += 1

    def close(self, identity: str) -> None:
        """Count one connection of ``identity`` closed."""
        used = self.by_identity.get(identity, 0)
        if used <= 1:
            self.by_identity.pop(identity, None)
        else:
            self.by_identity[identity] = used - 1
        self.total = max(0, self.total - 1)


class GoingAway(Protocol):
    """A connection served without a task (a pub/sub WebSocket)."""

    def going_away(self) -> None:
        """Say goodbye (close 1001) and close the connection."""


@dataclass(slots=True)
class ActiveStreams:
    """Cancellable work the node must end on shutdown (streams, sessions)."""

    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    sockets: set[GoingAway] = field(default_factory=set)
    closing: bool = False

    def add(self, task: asyncio.Task[Any]) -> None:
        """Track ``task`` until it finishes."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shutdown(self, grace_s: float) -> None:
        """Close task-less connections, let streams end for ``grace_s``, then cancel the
        rest and wait for them."""
        self.closing = True
        for socket_ in list(self.sockets):
            socket_.going_away()
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)


def make_middleware(metrics: TransportMetrics, max_header_bytes: int) -> Any:
    """The one middleware: header size limit, WireError -> JSON error, HTTP errors and
    undecodable bodies -> JSON, crashes -> internal_error. (One layer: each aiohttp
    middleware costs every request.)"""

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if sum(len(k) + len(v) + 4 for k, v in request.raw_headers) > max_header_bytes:
                raise PayloadTooLarge(f"headers over {max_header_bytes} bytes")
            response: web.StreamResponse = await handler(request)
            return response
        except WireError as exc:
            metrics.refused.inc(exc.code, "http")
            return error_response(exc)
        except web.HTTPRequestEntityTooLarge:
            metrics.refused.inc("payload_too_large", "http")
            return error_response(PayloadTooLarge("request body over the limit"))
        except web.HTTPNotFound:
            metrics.refused.inc("not_found", "http")
            return error_response(NotFound(f"no route {request.path}"))
        except web.HTTPMethodNotAllowed:
            metrics.refused.inc("bad_request", "http")
            return error_response(BadRequest(f"{request.method} not allowed on {request.path}"))
        except web.HTTPException:
            raise
        except (web.RequestPayloadError, HttpProcessingError) as exc:
            # request.read() raises these for a body aiohttp cannot decode: bytes that are
            # not what their Content-Encoding says, a broken chunked body. The client's
            # fault, not ours; the parser's own error is the reason.
            metrics.refused.inc("bad_request", "http")
            reason = getattr(exc.__cause__, "message", None) or getattr(exc, "message", "")
            return error_response(BadRequest(f"the request body cannot be read: {reason}"))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("handler failed on %s %s", request.method, request.path)
            metrics.refused.inc("internal_error", "http")
            return error_response(InternalError("unexpected failure; see the node log"))

    return guard


SNIFF_TIMEOUT_S = 10.0
TLS_RECORD_HANDSHAKE = 0x16

# Takes a connection whose first request is ``GET <path>`` with this head, or declines
# (None) so aiohttp serves it: returns the protocol now in charge of the transport.
RawUpgrade = Callable[[asyncio.Transport, RequestHead], asyncio.BaseProtocol | None]


class FrontDoor(asyncio.Protocol):
    """The first protocol of every connection: looks at the first request line and, for the
    few paths with a :data:`RawUpgrade` (pub/sub WebSockets), the head; everything else is
    handed to aiohttp untouched (bytes already read included) at the first line."""

    __slots__ = ("_buf", "_http", "_timer", "_transport", "_upgrades")

    def __init__(
        self, http: Callable[[], asyncio.BaseProtocol], upgrades: Mapping[str, RawUpgrade]
    ) -> None:
        self._http = http
        self._upgrades = upgrades
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Wait (bounded) for the first request line."""
        # uvloop's transports are not asyncio.Transport subclasses; they behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._timer = asyncio.get_running_loop().call_later(SNIFF_TIMEOUT_S, transport.close)

    def data_received(self, data: bytes) -> None:
        """Decide as soon as the bytes allow it."""
        buf = self._buf = self._buf + data
        line_end = buf.find(b"\r\n")
        if line_end < 0:
            if len(buf) > MAX_HEAD_BYTES or not b"GET /".startswith(buf[:5]):
                self._to_http()
            return
        parts = buf[:line_end].split(b" ")
        path = parts[1].split(b"?", 1)[0].decode("latin-1") if len(parts) == 3 else ""
        upgrade = self._upgrades.get(path) if parts[0] == b"GET" else None
        if upgrade is None:
            self._to_http()
            return
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._to_http()
            return
        head = parse_head(buf[:head_end])
        transport = self._transport
        assert transport is not None
        protocol = upgrade(transport, head) if head is not None else None
        if protocol is None:
            self._to_http()
            return
        self._done()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        rest = buf[head_end + 4 :]
        if rest:  # frames sent right behind the head
            cast(asyncio.Protocol, protocol).data_received(rest)

    def _to_http(self) -> None:
        transport = self._transport
        assert transport is not None
        buf = self._buf
        self._done()
        protocol = self._http()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if buf and not transport.is_closing():
            cast(asyncio.Protocol, protocol).data_received(buf)

    def _done(self) -> None:
        self._buf = b""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def eof_received(self) -> bool | None:
        """The client hung up before a whole request line: nothing to serve."""
        self._done()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """Gone before a decision."""
        self._done()


class HttpServer:
    """The node's single listening port (spec §3.1).

    Every connection starts with a :class:`FrontDoor`, which gives it to aiohttp or, for
    the paths in ``upgrades``, to a leaner protocol. With a TLS context the port serves TLS
    *and* plain HTTP: the first byte of each connection is peeked (a TLS handshake record
    starts with 0x16, an HTTP request with a letter) and the front door runs with or
    without TLS, so peers link over TLS while browsers and the CLI keep using plain HTTP.
    """

    def __init__(
        self,
        *,
        routes: Iterable[web.RouteDef],
        metrics: TransportMetrics,
        max_body_bytes: int,
        max_header_bytes: int,
        tls: ssl.SSLContext | None = None,
        upgrades: Mapping[str, RawUpgrade] | None = None,
    ) -> None:
        self.app = web.Application(
            client_max_size=max_body_bytes,
            middlewares=[make_middleware(metrics, max_header_bytes)],
        )
        self.app.add_routes(list(routes))
        self.tls = tls
        self.upgrades = dict(upgrades or {})
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._sniffing: set[asyncio.Task[None]] = set()
        self.host = ""
        self.port = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; returns the bound address (``port=0`` picks a free one)."""
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            # spec §3.6: a client closing an SSE stream is its cancel; aiohttp cancels the
            # handler, our handlers turn that into cancelling the capability.
            handler_cancellation=True,
            max_line_size=_PARSER_LIMIT,
            max_field_size=_PARSER_LIMIT,
            shutdown_timeout=1.0,
        )
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        if self.tls is None:
            self._server = await asyncio.get_running_loop().create_server(
                self._front_door, sock=sock, backlog=1024
            )
        else:
            self._accepting = asyncio.get_running_loop().create_task(self._accept_loop(sock))
        self.host, self.port = sock.getsockname()[:2]
        return self.host, self.port

    def _front_door(self) -> asyncio.BaseProtocol:
        assert self._runner is not None
        assert self._runner.server is not None
        return FrontDoor(self._runner.server, self.upgrades)

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
                conn.setblocking(False)
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)  # out of file descriptors, say: do not spin
                continue
            task = loop.create_task(self._serve_connection(conn))
            self._sniffing.add(task)
            task.add_done_callback(self._sniffing.discard)

    async def _serve_connection(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await asyncio.wait_for(_peek(loop, conn), SNIFF_TIMEOUT_S)
        except (TimeoutError, OSError):
            conn.close()
            return
        except asyncio.CancelledError:  # shutdown while the client had sent nothing yet
            conn.close()
            raise
        if not first or self._runner is None:
            conn.close()
            return
        tls = self.tls if first[0] == TLS_RECORD_HANDSHAKE else None
        try:
            await loop.connect_accepted_socket(
                self._front_door,
                conn,
                ssl=tls,
                ssl_handshake_timeout=SNIFF_TIMEOUT_S if tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            log.debug("connection dropped during set-up: %s", exc)
            conn.close()

    async def stop_accepting(self) -> None:
        """Close the listening socket; running requests go on."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
            for task in list(self._sniffing):
                task.cancel()
            if self._sock is not None:
                self._sock.close()

    async def close(self) -> None:
        """Stop everything."""
        await self.stop_accepting()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The first byte the client sent, left in the socket for whoever reads next."""
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), ready)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(1, socket.MSG_PEEK)
