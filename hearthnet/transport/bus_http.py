"""``POST /bus/v1/call`` with a JSON or SSE answer (spec §2.2, §3.3), and
``GET /bus/v1/capabilities``.

Thin glue: headers and body in, :class:`~hearthnet.auth.Authenticator` and
:class:`~hearthnet.bus.calls.Bus` do the work, frames out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from hearthnet.auth import Authenticator
from hearthnet.bus.calls import Bus, CallHandle
from hearthnet.bus.envelope import VerifiedCall
from hearthnet.bus.routing import check_target
from hearthnet.bus.signatures import SignatureWorker
from hearthnet.clock import now_ms
from hearthnet.config import TransportSection
from hearthnet.errors import BadRequest, Unavailable, WireError
from hearthnet.frames import Frame
from hearthnet.ids import new_ulid
from hearthnet.sessions import SessionRegistry
from hearthnet.transport import headers as h
from hearthnet.transport.codec import SSE_KEEPALIVE, loads, sse_event
from hearthnet.transport.server import (
    ActiveStreams,
    ConnectionTracker,
    TransportMetrics,
    json_response,
)


@dataclass(slots=True)
class BusEndpointDeps:
    """What the bus endpoints need from the node."""

    node_id: str
    transport: TransportSection
    authenticator: Authenticator
    bus: Bus
    metrics: TransportMetrics
    connections: ConnectionTracker
    streams: ActiveStreams
    sessions: SessionRegistry
    # the worker thread that checks call signatures beside the event loop (None: on it)
    signatures: SignatureWorker | None = None


SHUTTING_DOWN = Unavailable("node shutting down", retry_after_ms=1000)

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class SseWriter:
    """Writes SSE events to a prepared response and comments ``: keepalive`` when quiet."""

    def __init__(self, response: web.StreamResponse, keepalive_s: float) -> None:
        self.response = response
        self.keepalive_s = keepalive_s
        self._last_write = time.monotonic()
        self._keepalive: asyncio.Task[None] | None = None

    async def write(self, data: bytes) -> None:
        """Write one event (waits for TCP back-pressure: spec §3.6 over SSE)."""
        self._last_write = time.monotonic()
        await self.response.write(data)

    def __enter__(self) -> SseWriter:
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()

    async def _keep_alive(self) -> None:
        while True:
            wait = self._last_write + self.keepalive_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.write(SSE_KEEPALIVE)


def _body(raw: bytes) -> dict[str, Any]:
    body = loads(raw) if raw else None
    if not isinstance(body, dict):
        raise BadRequest('the request body is a JSON object {"params"?, "input"}')
    return body


class BusHttpEndpoints:
    """The HTTP side of the bus."""

    def __init__(self, deps: BusEndpointDeps) -> None:
        self.deps = deps

    def routes(self) -> list[web.RouteDef]:
        """Routes this component serves (the WS upgrade on GET is in bus_ws)."""
        return [
            web.post("/bus/v1/call", self.call),
            web.get("/bus/v1/capabilities", self.capabilities),
        ]

    def verify(self, headers: Mapping[str, str], body: Any) -> VerifiedCall:
        """Authenticate a call from its headers and parsed body."""
        ch, envelope, signature = self._envelope(headers, body)
        return self.deps.authenticator.authenticate_call(
            envelope,
            signature=signature,
            token=ch.signed.token,
            now_ms=now_ms(),
            target=check_target(ch.target),
            deadline_ms=ch.deadline_ms,
        )

    def _envelope(
        self, headers: Mapping[str, str], body: Any
    ) -> tuple[h.CallHeaders, dict[str, Any], str | None]:
        """The call's headers, its envelope, and its signature (None for a token)."""
        deps = self.deps
        ch = h.read_call_headers(headers)
        signed = ch.signed
        envelope: dict[str, Any] = {
            "body": body,
            "capability": ch.capability,
            "version": ch.version,
            "request_id": signed.request_id or new_ulid(),
            "community": signed.community or deps.authenticator.community_id,
            "ts": signed.ts if signed.ts is not None else now_ms(),
        }
        if signed.token is None:
            envelope["from"] = signed.sender
        return ch, envelope, signed.signature if signed.token is None else None

    def open(self, headers: Mapping[str, str], raw: bytes) -> CallHandle:
        """Read, authenticate and route a call from its headers and body bytes."""
        return self.deps.bus.open(self.verify(headers, _body(raw)), inline_tools=False)

    async def _open_unary(self, headers: Mapping[str, str], raw: bytes, alone: bool) -> CallHandle:
        """:meth:`open`, the signature checked on the node's signature worker when it
        has one and other calls are being answered (spec §11: the check runs beside the
        event loop; a call alone gains nothing from the hand-off)."""
        checks = self.deps.signatures
        if checks is None or alone:
            return self.open(headers, raw)
        ch, envelope, signature = self._envelope(headers, _body(raw))
        call = await self.deps.authenticator.authenticate_call_on(
            checks,
            envelope,
            signature=signature,
            token=ch.signed.token,
            now_ms=now_ms(),
            target=check_target(ch.target),
            deadline_ms=ch.deadline_ms,
        )
        return self.deps.bus.open(call, inline_tools=False)

    async def unary_call(
        self, headers: Mapping[str, str], raw: bytes, *, alone: bool = False
    ) -> bytes:
        """A unary call's JSON answer body (what :meth:`call` answers without
        ``Accept: text/event-stream``, and the lean call path's answer). ``alone``: the
        lean path answers no other call now, so the signature is checked at once on the
        loop instead of on the signature worker.

        Raises:
            WireError: refused or failed, with the code of spec §2.4.
        """
        handle = await self._open_unary(headers, raw, alone)
        if handle.descriptor.streaming:
            handle.close("bad_request")
            raise BadRequest(
                f"{handle.descriptor.key} streams: send Accept: text/event-stream "
                "or upgrade to WebSocket"
            )
        started = time.monotonic()
        output = await handle.result()
        ms = int((time.monotonic() - started) * 1000)
        return orjson.dumps({"output": output, "meta": {"ms": ms, "node": handle.provider.node_id}})

    async def call(self, request: web.Request) -> web.StreamResponse:
        """``POST /bus/v1/call``."""
        raw = await request.read()
        if "text/event-stream" not in request.headers.get("Accept", ""):
            answer = await self.unary_call(request.headers, raw)
            return web.Response(body=answer, content_type="application/json")
        return await self._sse(request, self.open(request.headers, raw))

    async def _sse(self, request: web.Request, handle: CallHandle) -> web.StreamResponse:
        deps = self.deps
        identity = handle.call.caller.identity
        try:
            deps.connections.open(identity)
        except Exception:
            handle.close("capacity_exceeded")
            raise
        response = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await response.prepare(request)
            with SseWriter(response, deps.transport.sse_keepalive_s) as out:

                async def emit(frame: Frame) -> None:
                    await out.write(sse_event(frame))

                task = asyncio.current_task()
                assert task is not None
                deps.streams.add(task)
                revoked: list[WireError] = []

                def revoke(error: WireError) -> None:
                    revoked.append(error)
                    task.cancel()

                session_key = deps.sessions.add(handle.call.caller, revoke)
                try:
                    terminal = await handle.drive(emit)
                except asyncio.CancelledError:
                    # The client closed the stream (its cancel, spec §3.6), the node is
                    # shutting down, or the caller was revoked.
                    handle.ctx.cancel()
                    if revoked:
                        task.uncancel()
                        terminal = Frame("error", revoked[0].to_frame_data())
                    elif deps.streams.closing:
                        with contextlib.suppress(ConnectionError, RuntimeError):
                            await out.write(
                                sse_event(Frame("error", SHUTTING_DOWN.to_frame_data()))
                            )
                    else:
                        deps.metrics.abandoned.inc("sse")
                    if not revoked:
                        raise
                finally:
                    deps.sessions.remove(session_key)
                await out.write(sse_event(terminal))
                await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            deps.metrics.abandoned.inc("sse")
        finally:
            handle.close("cancelled")
            deps.connections.close(identity)
        return response

    async def capabilities(self, request: web.Request) -> web.Response:
        """``GET /bus/v1/capabilities``: descriptors in the mesh, with provider and health."""
        return json_response({"capabilities": self.deps.bus.router.offered()})
