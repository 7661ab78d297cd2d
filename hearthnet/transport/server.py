"""The one HTTP port (spec §3.1): aiohttp application, error middleware, limits.

Components (bus, pub/sub, mesh, node status) contribute routes; this module turns
every :class:`WireError` into the JSON error body of spec §2.2 with its status, counts
every refusal, and turns anything unexpected into ``internal_error`` without taking
the node down.
"""

from __future__ import annotations

import asyncio
import logging
import socket
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


class HttpServer:
    """The node's single listening port."""

    def __init__(
        self,
        *,
        routes: Iterable[web.RouteDef],
        metrics: TransportMetrics,
        max_body_bytes: int,
        max_header_bytes: int,
    ) -> None:
        self.app = web.Application(
            client_max_size=max_body_bytes,
            middlewares=[make_middleware(metrics, max_header_bytes)],
        )
        self.app.add_routes(list(routes))
        self._runner: web.AppRunner | None = None
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
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
        site = web.SockSite(self._runner, sock)
        await site.start()
        self.host, self.port = sock.getsockname()[:2]
        return self.host, self.port

    async def stop_accepting(self) -> None:
        """Close the listening socket; running requests go on."""
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()

    async def close(self) -> None:
        """Stop everything."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
