"""``GET /bus/v1/call`` upgraded to WebSocket (spec §3.5–3.6): aiohttp glue around
:class:`~hearthnet.transport.bus_stream.BusStreamProtocol`.

One socket carries one call. Three coroutines per socket, all owned and ended here:
the producer (the capability's frames, paced by the window), the reader (acks, tool
results, cancel, pings/pongs) and the watchdog (pings, missed pongs, idle close).

The frames a session sends within one event-loop turn (the producer fills the window a
burst at a time: up to ``stream_window`` frames after each ack) leave in one transport
write (:class:`TurnWriter`): one ``send`` system call per burst instead of one per frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiohttp import ClientConnectionResetError, WSMsgType, web
from aiohttp._websocket.writer import WebSocketWriter

from hearthnet.bus.calls import CallHandle
from hearthnet.bus.envelope import VerifiedCall
from hearthnet.bus.routing import check_target
from hearthnet.clock import now_ms
from hearthnet.errors import (
    BadRequest,
    Cancelled,
    CapacityExceeded,
    DeadlineExceeded,
    PayloadTooLarge,
    Unavailable,
    UpgradeRequired,
    WireError,
    WrongFrameType,
)
from hearthnet.frames import Frame
from hearthnet.transport import headers as h
from hearthnet.transport.bus_http import SHUTTING_DOWN, BusEndpointDeps
from hearthnet.transport.bus_stream import (
    Ack,
    BusStreamProtocol,
    CallRequest,
    CancelRequest,
    ToolResult,
)
from hearthnet.transport.codec import SUBPROTOCOL_HEADER, FrameCodec, choose_subprotocol
from hearthnet.transport.keepalive import (
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    CLOSE_UNSUPPORTED_DATA,
    Close,
    Keepalive,
    SendPing,
)
from hearthnet.transport.rawwriter import raw_writer
from hearthnet.transport.server import error_response
from hearthnet.transport.websocket import ws_frame

log = logging.getLogger("hearthnet.transport.ws")

# Refusals of who the caller is, or of how it speaks, close with 1008 (spec §3.5);
# other refusals end the call normally after the error frame.
_POLICY_CODES = frozenset(
    {
        "bad_request",
        "invalid_signature",
        "unauthorized",
        "revoked",
        "expired",
        "replayed",
        "forbidden",
        "upgrade_required",
    }
)


def close_code_for(error: WireError) -> int:
    """The WebSocket close code that follows an ``error`` frame."""
    if isinstance(error, WrongFrameType):
        return CLOSE_UNSUPPORTED_DATA
    if isinstance(error, PayloadTooLarge):
        return CLOSE_TOO_BIG
    if isinstance(error, CapacityExceeded):
        return CLOSE_TRY_AGAIN
    return CLOSE_POLICY if error.code in _POLICY_CODES else CLOSE_NORMAL


TURN_FLUSH_BYTES = 64 * 1024  # payload bytes held in one turn before they are written at once


class TurnWriter:
    """Server frames sent within one event-loop turn, written to the transport at once.

    Frames are built here (:func:`~hearthnet.transport.websocket.ws_frame`: unmasked, FIN,
    no extension) and written by a callback at the end of the turn, or at once when
    :data:`TURN_FLUSH_BYTES` are held or :meth:`flush` is called (before a close, ping or
    pong, so nothing overtakes them). Back-pressure is aiohttp's: while the transport is
    above its high-water mark, :meth:`send` waits for it to drain. The aiohttp parts used
    (the response's writer, its transport and protocol) are not API: without them, or with
    compression, every frame goes through ``send_frame`` as before.
    """

    __slots__ = ("_handle", "_loop", "_opcode", "_parts", "_size", "_writer", "ws")

    def __init__(self, ws: web.WebSocketResponse, opcode: int) -> None:
        self.ws = ws
        self._opcode = int(opcode)
        self._loop = asyncio.get_running_loop()
        self._parts: list[bytes] = []
        self._size = 0
        self._handle: asyncio.Handle | None = None
        self._writer: WebSocketWriter | None = None

    def _usable(self) -> WebSocketWriter | None:
        writer = raw_writer(self.ws)
        if writer is not None and not writer.use_mask:  # server frames go unmasked
            self._writer = writer
            return writer
        return None

    async def send(self, data: bytes) -> None:
        """Send one data frame after those already held.

        Raises:
            ConnectionError: the connection is closing or gone (as ``send_frame``).
        """
        writer = self._writer or self._usable()
        if writer is None:
            await self.ws.send_frame(data, WSMsgType(self._opcode))
            return
        if writer._closing or writer.transport.is_closing():
            raise ClientConnectionResetError("Cannot write to closing transport")
        self._parts.append(ws_frame(data, self._opcode))
        self._size += len(data)
        if self._size >= TURN_FLUSH_BYTES:
            self.flush()
        elif self._handle is None:
            self._handle = self._loop.call_soon(self.flush)
        protocol = writer.protocol
        if protocol._paused:  # the socket's buffer is full: wait until it drains
            await protocol._drain_helper()

    def flush(self) -> None:
        """Write what is held (dropped when the connection is already closing)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        parts = self._parts
        if not parts or self._writer is None:
            return
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        self._size = 0
        transport = self._writer.transport
        if not transport.is_closing():
            transport.write(data)


class BusWebSocketEndpoint:
    """Accepts bus WebSocket upgrades."""

    def __init__(self, deps: BusEndpointDeps) -> None:
        self.deps = deps

    def routes(self) -> list[web.RouteDef]:
        """``GET /bus/v1/call``."""
        return [web.get("/bus/v1/call", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Negotiate the upgrade (426/503 before 101), then run the session."""
        deps = self.deps
        if request.headers.get("Upgrade", "").lower() != "websocket":
            raise UpgradeRequired("GET /bus/v1/call is the WebSocket upgrade; POST for HTTP calls")
        if not deps.transport.websocket_enabled or deps.connections.full or deps.streams.closing:
            deps.metrics.refused.inc("unavailable", "ws")
            return error_response(
                Unavailable("WebSocket not available now; use SSE", retry_after_ms=1000)
            )
        chosen = choose_subprotocol(request.headers.get("Sec-WebSocket-Protocol"))
        if chosen is None:
            deps.metrics.refused.inc("upgrade_required", "ws")
            return error_response(
                UpgradeRequired(f"supported subprotocols: {SUBPROTOCOL_HEADER}"),
                headers={"Sec-WebSocket-Protocol": SUBPROTOCOL_HEADER},
            )
        capability = request.headers.get(h.CAPABILITY)
        version = request.headers.get(h.VERSION)
        try:
            target = check_target(request.headers.get(h.TARGET))
            deadline_ms = h.read_deadline(request.headers)
        except WireError as exc:
            deps.metrics.refused.inc(exc.code, "ws")
            return error_response(exc)
        if capability and version:
            # spec §3.5: a client that names the capability learns at once that it cannot stream
            try:
                _, desc = deps.bus.router.choose(capability, version, target, time.monotonic())
            except WireError as exc:
                deps.metrics.refused.inc(exc.code, "ws")
                return error_response(exc)
            if not desc.streaming:
                deps.metrics.refused.inc("upgrade_required", "ws")
                return error_response(
                    UpgradeRequired(f"{desc.key} does not stream; use POST /bus/v1/call"),
                    headers={"Sec-WebSocket-Protocol": SUBPROTOCOL_HEADER},
                )
        ws = web.WebSocketResponse(
            protocols=(chosen,),
            autoping=False,
            autoclose=True,
            compress=False,
            max_msg_size=deps.transport.max_ws_message_bytes,
            timeout=2.0,
        )
        await ws.prepare(request)
        session = _BusSession(deps, ws, FrameCodec(chosen), target, deadline_ms)
        task = asyncio.current_task()
        if task is not None:
            deps.streams.add(task)
        try:
            await session.run()
        finally:
            deps.metrics.ws_closed.inc(str(session.close_code or ws.close_code or 1006))
        return ws


class _BusSession:
    """One bus WebSocket from first frame to close."""

    def __init__(
        self,
        deps: BusEndpointDeps,
        ws: web.WebSocketResponse,
        codec: FrameCodec,
        target: str | None = None,
        deadline_ms: int | None = None,
    ) -> None:
        self.deps = deps
        self.ws = ws
        self.target = target  # from X-HearthNet-Target on the upgrade, if any
        self.deadline_ms = deadline_ms  # from X-HearthNet-Deadline-Ms on the upgrade
        cfg = deps.transport
        self.proto = BusStreamProtocol(
            codec, window=cfg.stream_window, max_message_bytes=cfg.max_ws_message_bytes
        )
        self.opcode = WSMsgType.BINARY if codec.binary else WSMsgType.TEXT
        self.out = TurnWriter(ws, self.opcode)
        self.loop = asyncio.get_running_loop()
        self.keepalive = Keepalive(
            now=self.loop.time(),
            ping_s=cfg.ws_ping_s,
            missed_pongs=cfg.ws_missed_pongs,
            idle_s=cfg.ws_idle_s,
        )
        self.window_moved = asyncio.Event()
        self.server_close: Close | None = None
        self.handle: CallHandle | None = None
        self.close_code: int | None = None
        self.revoked: WireError | None = None
        self._reader: asyncio.Task[tuple[str, WireError | None]] | None = None

    # --- sending -----------------------------------------------------------------

    async def _send(self, frame: Frame, *, numbered: bool = True) -> None:
        data = self.proto.encode(frame) if numbered else self.proto.encode_unnumbered(frame)
        await self.out.send(data)
        self.keepalive.data(self.loop.time())

    async def _close(self, code: int, message: bytes = b"") -> None:
        """Write the frames held, then close."""
        self.out.flush()
        await self.ws.close(code=code, message=message)

    async def _emit(self, frame: Frame) -> None:
        """The producer's sink: wait for the window (spec §3.6), then send."""
        if not self.proto.can_send:
            try:
                async with asyncio.timeout(self.deps.transport.stream_ack_timeout_s):
                    while not self.proto.can_send:
                        self.window_moved.clear()
                        await self.window_moved.wait()
            except TimeoutError:
                raise DeadlineExceeded(
                    f"no ack for {self.deps.transport.stream_ack_timeout_s:g} s, window full"
                ) from None
        await self._send(frame)

    async def _refuse(self, error: WireError) -> None:
        self.deps.metrics.refused.inc(error.code, "ws")
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._send(Frame("error", error.to_frame_data()), numbered=False)
        await self._close(code=close_code_for(error), message=error.code.encode())

    # --- receiving ---------------------------------------------------------------

    async def _receive(self) -> Any:
        """Next data message; answers pings, notes pongs; None when the socket ended."""
        while True:
            msg = await self.ws.receive()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                self.keepalive.data(self.loop.time())
                return msg
            if msg.type == WSMsgType.PING:
                self.out.flush()
                await self.ws.pong(msg.data)
            elif msg.type == WSMsgType.PONG:
                self.keepalive.pong()
            else:
                if msg.type == WSMsgType.ERROR:
                    # aiohttp has already closed with 1009 for an oversized message
                    too_big = getattr(msg.data, "code", None) == CLOSE_TOO_BIG
                    self.close_code = CLOSE_TOO_BIG if too_big else 1002
                    self.deps.metrics.refused.inc(
                        "payload_too_large" if too_big else "bad_request", "ws"
                    )
                return None

    def _parse(self, msg: Any) -> Any:
        return self.proto.receive(msg.data, binary=msg.type == WSMsgType.BINARY)

    async def _read_until_end(self) -> tuple[str, WireError | None]:
        """Reader: apply acks and tool results; return why the reading stopped."""
        assert self.handle is not None
        ctx = self.handle.ctx
        while True:
            msg = await self._receive()
            if msg is None:
                return ("gone", None)
            try:
                frame = self._parse(msg)
            except WireError as exc:
                return ("violation", exc)
            if isinstance(frame, Ack):
                if frame.released:
                    self.window_moved.set()
                else:
                    self.deps.metrics.ignored_acks.inc()
            elif isinstance(frame, ToolResult):
                try:
                    ctx.deliver_tool_result(frame.tool_call_id, frame.body)
                except WireError as exc:
                    # spec §5: refused cleanly: the stream goes on; the client is told.
                    self.deps.metrics.refused.inc(exc.code, "ws")
                    await self.out.send(
                        self.proto.codec.encode(
                            {
                                "event": "tool_result.refused",
                                "data": {
                                    "tool_call_id": frame.tool_call_id[:64],
                                    **exc.to_frame_data(),
                                },
                            }
                        )
                    )
            elif isinstance(frame, CancelRequest):
                return ("cancel", None)

    async def _watchdog(self) -> None:
        """Pings every ws_ping_s; close 4408 after missed pongs; close 1000 when idle."""
        while True:
            delay = self.keepalive.next_deadline() - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            action = self.keepalive.tick(self.loop.time())
            if isinstance(action, SendPing):
                with contextlib.suppress(ConnectionError, RuntimeError):
                    self.out.flush()
                    await self.ws.ping()
            elif isinstance(action, Close):
                self.server_close = action
                await self._close(code=action.code, message=action.reason.encode())
                return

    async def _authenticate(self, request: CallRequest) -> VerifiedCall:
        """The call frame's credentials checked; the signature by the node's checker
        process when it has one (a lone check is made on the loop there too)."""
        deps = self.deps
        args: dict[str, Any] = {
            "signature": request.signature,
            "token": request.token,
            "now_ms": now_ms(),
            "target": self._target(request.target),
            "deadline_ms": self._deadline(request.deadline_ms),
        }
        if deps.signatures is None:
            return deps.authenticator.authenticate_call(request.envelope, **args)
        return await deps.authenticator.authenticate_call_on(
            deps.signatures, request.envelope, **args
        )

    # --- the session -------------------------------------------------------------

    async def run(self) -> None:
        """First frame, admission, then stream until one side ends it."""
        watchdog = self.loop.create_task(self._watchdog())
        identity: str | None = None
        session_key: int | None = None
        try:
            try:
                async with asyncio.timeout(self.deps.transport.ws_first_frame_s):
                    msg = await self._receive()
            except TimeoutError:
                self.deps.metrics.refused.inc("timeout", "ws")
                await self._close(code=CLOSE_POLICY, message=b"no call frame")
                return
            if msg is None:
                return
            try:
                request = self._parse(msg)
                call = await self._authenticate(request)
                self.deps.connections.open(call.caller.identity)
                identity = call.caller.identity
                self.handle = self.deps.bus.open(call, inline_tools=True)
                session_key = self.deps.sessions.add(call.caller, self._revoke)
                if not self.handle.descriptor.streaming:
                    self.handle.close("upgrade_required")
                    raise UpgradeRequired(
                        f"{self.handle.descriptor.key} does not stream; use POST /bus/v1/call"
                    )
            except WireError as exc:
                await self._refuse(exc)
                return
            self.proto.start()
            await self._stream()
        finally:
            self.out.flush()
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            if self.handle is not None:
                # drive() closes it with the outcome; this frees the slot when the session
                # ended before drive() ever ran (closing is idempotent)
                self.handle.close("cancelled")
            if identity is not None:
                self.deps.connections.close(identity)
            if session_key is not None:
                self.deps.sessions.remove(session_key)

    def _target(self, in_frame: str | None) -> str | None:
        """The node to run the call on (spec §2.3): the call frame's ``target`` or the
        upgrade's header; the call is routed through the mesh like a pinned HTTP call.

        Raises:
            BadRequest: the frame and the header name different nodes.
        """
        if in_frame is not None and self.target is not None and in_frame != self.target:
            raise BadRequest("call.target and X-HearthNet-Target name different nodes")
        return in_frame if in_frame is not None else self.target

    def _deadline(self, in_frame: int | None) -> int | None:
        """The call's deadline in ms: the call frame's ``deadline_ms`` or the upgrade's
        header; with both, the earlier one (spec §2.3: a deadline only shortens a call)."""
        given = [d for d in (in_frame, self.deadline_ms) if d is not None]
        return min(given) if given else None

    def _revoke(self, error: WireError) -> None:
        """The caller was revoked (spec §1.5): end the stream with that error."""
        self.revoked = error
        if self._reader is not None:
            self._reader.cancel()

    async def _stream(self) -> None:
        assert self.handle is not None
        handle = self.handle
        producer = self.loop.create_task(handle.drive(self._emit))
        reader = self._reader = self.loop.create_task(self._read_until_end())
        try:
            await asyncio.wait({producer, reader}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._stop_producer(producer)
            reader.cancel()
            if self.deps.streams.closing:
                # node shutdown: end the stream with an error frame (spec §9)
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await self._send(Frame("error", SHUTTING_DOWN.to_frame_data()))
                    await self._close(code=1001, message=b"shutting down")
            else:
                # aiohttp cancels the handler when the client's connection is lost
                self.deps.metrics.abandoned.inc("ws")
            raise
        if producer.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            terminal = producer.result()
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._send(terminal)
                await self._close(code=CLOSE_NORMAL)
            return
        if reader.cancelled() and self.revoked is not None:
            await self._stop_producer(producer)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._send(Frame("error", self.revoked.to_frame_data()))
                await self._close(code=CLOSE_POLICY, message=b"revoked")
            return
        why, error = reader.result()
        await self._stop_producer(producer)
        if why == "cancel":
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._send(
                    Frame("error", Cancelled("cancelled by the client").to_frame_data())
                )
                await self._close(code=CLOSE_NORMAL)
        elif why == "violation" and error is not None:
            self.deps.metrics.refused.inc(error.code, "ws")
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._send(Frame("error", error.to_frame_data()))
            await self._close(code=close_code_for(error), message=error.code.encode())
        elif self.server_close is None:
            self.deps.metrics.abandoned.inc("ws")

    async def _stop_producer(self, producer: asyncio.Task[Frame]) -> None:
        """Cancel the capability (spec §3.6: its cleanup runs, we end within 200 ms)."""
        assert self.handle is not None
        self.handle.ctx.cancel()
        producer.cancel()
        done, _ = await asyncio.wait({producer}, timeout=0.15)
        if not done:
            log.warning(
                "capability %s ignored cancellation for 150 ms",
                self.handle.descriptor.key,
                extra={"request_id": self.handle.call.request_id},
            )
