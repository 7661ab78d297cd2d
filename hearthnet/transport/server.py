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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    InternalError,
    NotFound,
    PayloadTooLarge,
    WireError,
)
from hearthnet.metrics import Counter, MetricsRegistry

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

    def __init__(self, per_identity: int, total: int) -> None:
        self.per_identity = per_identity
        self.total_limit = total
        self.by_identity: dict[str, int] = {}
        self.total = 0

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
            raise CapacityExceeded("node connection limit reached", retry_after_ms=1000)
        used = self.by_identity.get(identity, 0)
        if used >= self.per_identity:
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


@dataclass(slots=True)
class ActiveStreams:
    """Cancellable work the node must end on shutdown (streams, sessions)."""

    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    closing: bool = False

    def add(self, task: asyncio.Task[Any]) -> None:
        """Track ``task`` until it finishes."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shutdown(self, grace_s: float) -> None:
        """Let streams end for ``grace_s``, then cancel the rest and wait for them."""
        self.closing = True
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)


def make_middleware(metrics: TransportMetrics, max_header_bytes: int) -> Any:
    """The one middleware: header size limit, WireError -> JSON error, HTTP errors -> JSON,
    crashes -> internal_error. (One layer: each aiohttp middleware costs every request.)"""

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
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("handler failed on %s %s", request.method, request.path)
            metrics.refused.inc("internal_error", "http")
            return error_response(InternalError("unexpected failure; see the node log"))

    return guard


SNIFF_TIMEOUT_S = 10.0
TLS_RECORD_HANDSHAKE = 0x16


class HttpServer:
    """The node's single listening port (spec §3.1).

    Without TLS it is a plain aiohttp site. With a TLS context it serves TLS *and* plain
    HTTP on the same port: the first byte of each connection is peeked (a TLS handshake
    record starts with 0x16, an HTTP request with a letter) and the connection is handed to
    aiohttp with or without TLS, so peers link over TLS while browsers and the CLI keep
    using plain HTTP.
    """

    def __init__(
        self,
        *,
        routes: Iterable[web.RouteDef],
        metrics: TransportMetrics,
        max_body_bytes: int,
        max_header_bytes: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.app = web.Application(
            client_max_size=max_body_bytes,
            middlewares=[make_middleware(metrics, max_header_bytes)],
        )
        self.app.add_routes(list(routes))
        self.tls = tls
        self._runner: web.AppRunner | None = None
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
            await web.SockSite(self._runner, sock).start()
        else:
            self._accepting = asyncio.get_running_loop().create_task(self._accept_loop(sock))
        self.host, self.port = sock.getsockname()[:2]
        return self.host, self.port

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)  # out of file descriptors, say: do not spin
                continue
            conn.setblocking(False)
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
        server = self._runner.server if self._runner is not None else None
        if not first or server is None:
            conn.close()
            return
        tls = self.tls if first[0] == TLS_RECORD_HANDSHAKE else None
        try:
            await loop.connect_accepted_socket(
                server, conn, ssl=tls, ssl_handshake_timeout=SNIFF_TIMEOUT_S if tls else None
            )
        except (OSError, ssl.SSLError) as exc:
            log.debug("connection dropped during set-up: %s", exc)
            conn.close()

    async def stop_accepting(self) -> None:
        """Close the listening socket; running requests go on."""
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
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
