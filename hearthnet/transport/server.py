"""The one HTTP port (spec §3.1): aiohttp application, error middleware, limits.

Components (bus, pub/sub, mesh, node status) contribute routes; this module turns
every :class:`WireError` into the JSON error body of spec §2.2 with its status, counts
every refusal, and turns anything unexpected into ``internal_error`` without taking
the node down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import resource
import socket
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    Forbidden,
    HeadersTooLarge,
    InternalError,
    NotFound,
    PayloadTooLarge,
    WireError,
)
from hearthnet.metrics import Counter, MetricsRegistry
from hearthnet.transport.callhead import CallHeadLimits
from hearthnet.transport.callpath import CallPath, CallPathLimits, CallService
from hearthnet.transport.closing import CLOSE_GRACE_S
from hearthnet.transport.cors import OriginPolicy, response_headers
from hearthnet.transport.frontdoor import (
    TLS_RECORD_HANDSHAKE,
    Closer,
    FrontDoor,
    HeadLimits,
    PreAuthGate,
    RawUpgrade,
    drop_unserved,
    peek,
    plain_response,
    readable,
    refusal_answer,
)
from hearthnet.transport.listener import open_listener
from hearthnet.transport.parser_errors import JsonErrorsHandler
from hearthnet.transport.preauth import Refusal, descriptor_budget

log = logging.getLogger("hearthnet.transport")

_EMFILE_LOG_EVERY_S = 10.0
_ACCEPT_BURST = 64  # connections taken off the backlog per wake-up of the accept loop

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


_CORS_ORIGIN = web.RequestKey("cors_origin", str)


def make_middleware(
    metrics: TransportMetrics, head: HeadLimits, origins: OriginPolicy | None = None
) -> Any:
    """The one middleware: header limits (for requests after the first on a connection;
    the front door checks first ones), the browser ``Origin`` check and preflights
    (:mod:`hearthnet.transport.cors`), WireError -> JSON error, HTTP errors and
    undecodable bodies -> JSON, crashes -> internal_error. (One layer: each aiohttp
    middleware costs every request.)"""
    max_header_bytes = head.max_header_bytes
    max_headers = head.max_headers

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            raw = request.raw_headers
            if len(raw) > max_headers:
                raise HeadersTooLarge(f"more than {max_headers} request headers")
            if sum(len(k) + len(v) + 4 for k, v in raw) > max_header_bytes:
                raise HeadersTooLarge(f"request headers over {max_header_bytes} bytes")
            origin = request.headers.get("Origin") if origins is not None else None
            if origin is not None and origins is not None:
                if not origins.allows(origin, host=request.host, scheme=request.scheme):
                    raise Forbidden(
                        f"origin {origin[:128]} is neither this node's own (a host name in "
                        "[security] allowed_hosts) nor in [security] allowed_origins"
                    )
                if request.method == "OPTIONS" and "Access-Control-Request-Method" in (
                    request.headers
                ):
                    requested = request.headers.get("Access-Control-Request-Headers", "")
                    return web.Response(
                        status=204, headers=origins.preflight_headers(origin, requested)
                    )
                request[_CORS_ORIGIN] = origin
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


class HttpServer:
    """The node's single listening port (spec §3.1).

    Every connection starts with a :class:`FrontDoor`, which gives it to aiohttp or, for
    the paths in ``upgrades`` and (with ``calls``) a first ``POST /bus/v1/call``, to a
    leaner protocol. With a TLS context the port serves TLS
    *and* plain HTTP: the first byte of each connection is peeked (a TLS handshake record
    starts with 0x16, an HTTP request with a letter) and the front door runs with or
    without TLS, so peers link over TLS while browsers and the CLI keep using plain HTTP.

    Connections are accepted by one loop of ours rather than asyncio's server, so each is
    counted from its accept (spec §2.5: head deadline, per-source cap, descriptor reserve)
    and running out of descriptors sheds the oldest pending connection instead of
    spinning on accept.
    """

    def __init__(
        self,
        *,
        routes: Iterable[web.RouteDef],
        metrics: TransportMetrics,
        max_body_bytes: int,
        head: HeadLimits | None = None,
        connections_refused: Counter | None = None,
        keepalive_idle_s: float = 15.0,
        tls: ssl.SSLContext | None = None,
        upgrades: Mapping[str, RawUpgrade] | None = None,
        origins: OriginPolicy | None = None,
        calls: CallService | None = None,
    ) -> None:
        self.head = head or HeadLimits()
        self.max_body_bytes = max_body_bytes
        self.calls = calls  # serves plain POST /bus/v1/call on the lean path when set
        self.call_path: CallPath | None = None
        self.app = web.Application(
            client_max_size=max_body_bytes,
            middlewares=[make_middleware(metrics, self.head, origins)],
        )
        if origins is not None:
            # headers of allowed cross-origin answers go out with the head, so before an
            # SSE stream's first byte too (a handler prepares those itself)
            self.app.on_response_prepare.append(_allow_origin)
        self.app.add_routes(list(routes))
        self.metrics = metrics
        self.connections_refused = connections_refused or Counter("refused", "", ("limit",))
        self.keepalive_idle_s = keepalive_idle_s
        self.tls = tls
        self.upgrades = dict(upgrades or {})
        self.gate: PreAuthGate | None = None
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._sweeping: asyncio.Task[None] | None = None
        self._call_sweeping: asyncio.Task[None] | None = None
        self._sniffing: set[asyncio.Task[None]] = set()
        # spec §9: TLS closes in flight at stop get this long before they are aborted
        self.close_grace_s = CLOSE_GRACE_S
        self._spare: int | None = None
        self._emfile_logged = -_EMFILE_LOG_EVERY_S
        self._emfile_count = 0
        self.host = ""
        self.port = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; returns the bound address (``port=0`` picks a free one)."""
        # What each connection's handler is made with (see JsonErrorsHandler below).
        handler_args: dict[str, Any] = {
            "access_log": None,
            "max_line_size": _PARSER_LIMIT,
            "max_field_size": _PARSER_LIMIT,
            # above ours, so a later request on a kept-alive connection with too many
            # headers reaches the middleware and is answered in JSON
            "max_headers": self.head.max_headers * 16,
            "keepalive_timeout": self.keepalive_idle_s,
        }
        self._runner = web.AppRunner(
            self.app,
            handle_signals=False,
            # spec §3.6: a client closing an SSE stream is its cancel; aiohttp cancels the
            # handler, our handlers turn that into cancelling the capability.
            handler_cancellation=True,
            shutdown_timeout=1.0,
            **handler_args,
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()

        def http() -> asyncio.BaseProtocol:
            # aiohttp's own handler, but what its parser refuses is answered in JSON
            return JsonErrorsHandler(
                server, loop=loop, requests_refused=self.metrics.refused, **handler_args
            )

        sock = open_listener(host, port)
        self._sock = sock
        self._spare = _open_spare()
        capacity, reserve = descriptor_budget(
            _nofile(), _descriptors_in_use(), self.head.fd_reserve
        )
        limits = dataclasses.replace(self.head.limits, capacity=capacity, reserve=reserve)
        if self.calls is not None:
            self.call_path = CallPath(self.calls, self._call_limits(), http, self.metrics.refused)
            self._call_sweeping = loop.create_task(self.call_path.run_sweeps(limits.tick_s))
        self.gate = PreAuthGate(
            dataclasses.replace(self.head, limits=limits),
            self.metrics.refused,
            self.connections_refused,
            http,
            self.upgrades,
            calls=self.call_path.protocol if self.call_path is not None else None,
        )
        self._accepting = loop.create_task(self._accept_loop(sock, self.gate))
        self._sweeping = loop.create_task(self.gate.run_sweeps())
        self.host, self.port = sock.getsockname()[:2]
        return self.host, self.port

    def _call_limits(self) -> CallPathLimits:
        head = self.head
        return CallPathLimits(
            head=CallHeadLimits(head.max_headers, head.max_header_bytes, self.max_body_bytes),
            keepalive_idle_s=self.keepalive_idle_s,
            head_timeout_s=head.limits.head_timeout_s,
            body_grace_s=head.limits.body_grace_s,
            body_min_bytes_per_s=head.limits.body_min_bytes_per_s,
        )

    async def _accept_loop(self, sock: socket.socket, gate: PreAuthGate) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await readable(loop, sock)
            # What the backlog holds is taken with no await in between, so a cancel (the
            # stop) never lands on a socket taken and not yet served; at most a burst per
            # wake-up, so a connection storm does not hold the loop.
            for _ in range(_ACCEPT_BURST):
                try:
                    conn, address = sock.accept()
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EMFILE, errno.ENFILE):
                        log.debug("accept failed: %s", exc)
                        continue
                    if not self._out_of_descriptors(sock, gate):
                        await asyncio.sleep(0.1)  # nothing to shed, no spare: do not spin
                    break
                key, refusal = gate.open(str(address[0]))
                if refusal is not None:
                    _refuse_socket(conn, refusal)
                    continue
                conn.setblocking(False)
                self._serve(conn, key, gate)

    def serve_socket(self, conn: socket.socket, peer_ip: str) -> bool:
        """Serve a connection this node opened itself (a punched one, spec §8) as if it
        had been accepted; False when the pre-auth gate refused it (then it is closed)."""
        if self.gate is None:
            conn.close()
            return False
        key, refusal = self.gate.open(peer_ip)
        if refusal is not None:
            _refuse_socket(conn, refusal)
            return False
        conn.setblocking(False)
        self._serve(conn, key, self.gate)
        return True

    def _serve(self, conn: socket.socket, key: int, gate: PreAuthGate) -> None:
        task = asyncio.get_running_loop().create_task(self._serve_connection(conn, key, gate))
        gate.closers[key] = _canceller(task)
        self._sniffing.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._sniffing.discard(task)
            if task.cancelled():  # cancelled before its first step, it cleaned up nothing
                conn.close()
                gate.closed(key)

        task.add_done_callback(done)

    def _out_of_descriptors(self, sock: socket.socket, gate: PreAuthGate) -> bool:
        """accept() failed with EMFILE: shed the oldest pending connection, and take the
        waiting one off the backlog with the spare descriptor (closing it at once).
        Logged once per interval, not once per accept. False when neither was possible."""
        shed = gate.shed_oldest()
        spared = False
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                conn, _ = sock.accept()
            except OSError:
                pass
            else:
                _refuse_socket(conn, Refusal.OUT_OF_DESCRIPTORS)
                self.connections_refused.inc(Refusal.OUT_OF_DESCRIPTORS.value)
                spared = True
            self._spare = _open_spare()
        self._emfile_count += 1
        now = time.monotonic()
        if now - self._emfile_logged >= _EMFILE_LOG_EVERY_S:
            log.warning(
                "out of file descriptors: %d accept(s) refused; shedding the oldest "
                "unauthenticated connections",
                self._emfile_count,
            )
            self._emfile_logged = now
            self._emfile_count = 0
        return shed or spared

    async def _serve_connection(self, conn: socket.socket, key: int, gate: PreAuthGate) -> None:
        loop = asyncio.get_running_loop()
        door = FrontDoor(gate, key)  # registers itself when its connection is made
        try:
            tls: ssl.SSLContext | None = None
            if self.tls is not None:
                # the head deadline covers this wait: the sweep cancels us when it passes
                first = await peek(loop, conn)
                if not first or self._runner is None:
                    raise ConnectionResetError("closed before sending anything")
                tls = self.tls if first[0] == TLS_RECORD_HANDSHAKE else None
            await loop.connect_accepted_socket(
                lambda: door,
                conn,
                ssl=tls,
                ssl_handshake_timeout=gate.head.limits.head_timeout_s if tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            log.debug("connection dropped during set-up: %s", exc)
            drop_unserved(conn, door)
            gate.closed(key)
        except asyncio.CancelledError:  # head deadline, shedding or shutdown
            drop_unserved(conn, door)
            gate.closed(key)
            raise

    async def stop_accepting(self) -> None:
        """Close the listening socket; running requests go on."""
        for task in (self._accepting, self._sweeping, self._call_sweeping):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._accepting = self._sweeping = self._call_sweeping = None
        sniffing = list(self._sniffing)
        for task in sniffing:
            task.cancel()
        if sniffing:  # each closes its socket (or half-made transport) as it ends
            await asyncio.wait(sniffing, timeout=self.close_grace_s)
        if self.gate is not None:
            self.gate.close_pending()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    async def close(self) -> None:
        """Stop everything; returns once every accepted connection is closed (TLS closes
        in flight get :attr:`close_grace_s`, then they are aborted)."""
        await self.stop_accepting()
        if self.call_path is not None:
            await self.call_path.shutdown(grace_s=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.gate is not None:
            aborted = await self.gate.connections.close_all(self.close_grace_s)
            if aborted:
                log.debug("aborted %d connection(s) whose TLS close went unanswered", aborted)


async def _allow_origin(request: web.Request, response: web.StreamResponse) -> None:
    origin = request.get(_CORS_ORIGIN)
    if origin is not None:
        response.headers.update(response_headers(origin))


def _canceller(task: asyncio.Task[None]) -> Closer:
    def cancel(_reason: Refusal | None) -> None:
        task.cancel()

    return cancel


def _refuse_socket(conn: socket.socket, refusal: Refusal) -> None:
    """Answer a connection refused at accept (best effort, never blocking) and close it."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        # what the client sent already is read first: closing a socket with unread input
        # resets the connection, and the client may lose the answer
        conn.recv(65536)
    with contextlib.suppress(OSError):
        conn.send(plain_response(refusal_answer(refusal)))
    conn.close()


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None


def _nofile() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _descriptors_in_use() -> int:
    """Descriptors open now (the log, the store, the listener...); a guess off Linux."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64
