"""The pub/sub WebSocket's connection (spec §2.2, §3.6): ``GET /pubsub/v1/subscribe``
upgraded raw when it is a connection's first request (:class:`LeanWebSocket`: a frame
reader and a session, nothing else), through aiohttp otherwise. Either way the session
(:class:`~hearthnet.pubsub.ws.WsSession`) gets the same events, and fan-out writes through
a sink that follows the transport's pause/resume (:mod:`hearthnet.pubsub.sinks`).
"""

from __future__ import annotations

import asyncio

from aiohttp import WSMsgType, web
from aiohttp._websocket.helpers import websocket_mask

from hearthnet.errors import Unavailable, UpgradeRequired, WireError
from hearthnet.pubsub.sinks import AiohttpSink, SocketSink, Transport
from hearthnet.pubsub.ws import PubSubDeps, WsSession
from hearthnet.pubsub.ws_frames import WsFrames
from hearthnet.transport import websocket as rfc6455
from hearthnet.transport.codec import SUBPROTOCOL_HEADER, choose_subprotocol
from hearthnet.transport.keepalive import CLOSE_TOO_BIG
from hearthnet.transport.server import error_response

_SESSION_MESSAGES = frozenset({WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.PING, WSMsgType.PONG})


def compiled_unmask(payload: bytes, mask: bytes) -> bytearray:
    """RFC 6455 §5.3 unmasking by aiohttp's compiled XOR, in place in the one copy made
    of the frame's bytes: every publish and ack of a session passes here."""
    buf = bytearray(payload)
    websocket_mask(mask, buf)
    return buf


class LeanWebSocket(SocketSink, asyncio.Protocol):
    """A pub/sub WebSocket served straight from the transport (spec §11: 20,000 idle
    subscribers in ≤ 15 MiB per 1,000): a frame reader and a session, nothing else. It is
    also the session's sink: the transport's pause_writing/resume_writing pace fan-out."""

    __slots__ = ("reader", "session")
    session: WsSession  # set right after construction (the session writes through self)

    def __init__(self, transport: Transport, max_message: int) -> None:
        super().__init__(transport)
        self.reader = rfc6455.FrameReader(max_message, compiled_unmask)

    def data_received(self, data: bytes) -> None:
        """Frames in; each event to the session, until it closes."""
        session = self.session
        try:
            events = self.reader.feed(data)
        except rfc6455.WsProtocolError as exc:
            session.protocol_error(exc.code, exc.reason)
            return
        transport = session.transport
        try:
            for event in events:
                if transport.is_closing():
                    return
                if session.closing and not isinstance(event, rfc6455.CloseReceived):
                    continue  # draining after our close frame (see WsSession.hard_close)
                if isinstance(event, rfc6455.Message):
                    session.on_message(event.payload, binary=event.binary)
                elif isinstance(event, rfc6455.Ping):
                    session.on_ping(event.payload)
                elif isinstance(event, rfc6455.Pong):
                    session.on_pong()
                else:
                    session.on_close(event.code)
        except Exception:
            session.internal_error()

    def eof_received(self) -> bool | None:
        """The client half-closed: the transport closes."""
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket ended."""
        self.session.finish()


class PubSubWebSocket:
    """Upgrades ``GET /pubsub/v1/subscribe``: as a raw upgrade when it is the connection's
    first request (:meth:`upgrade`), through aiohttp otherwise (:meth:`handle`)."""

    def __init__(self, deps: PubSubDeps) -> None:
        self.deps = deps
        self.frames = WsFrames(deps)

    def _refusal(self, offered: str) -> WireError | None:
        deps = self.deps
        if not deps.transport.websocket_enabled or deps.connections.full or deps.streams.closing:
            return Unavailable("WebSocket not available now; use SSE", retry_after_ms=1000)
        if choose_subprotocol(offered) is None and offered.strip(" ,"):  # none is fine: JSON
            return UpgradeRequired(f"supported subprotocols: {SUBPROTOCOL_HEADER}")
        return None

    def upgrade(
        self, transport: asyncio.Transport, head: rfc6455.RequestHead
    ) -> LeanWebSocket | None:
        """Take a connection whose first request is a valid upgrade; None leaves every
        refusal and oddity to :meth:`handle` (same answers, same counters)."""
        deps = self.deps
        offered = head.headers.get("sec-websocket-protocol", "")
        header_bytes = sum(len(k) + len(v) + 4 for k, v in head.headers.items())
        if self._refusal(offered) is not None or header_bytes > deps.transport.max_header_bytes:
            return None
        origin = head.headers.get("origin")
        if origin is not None and deps.origins is not None:
            scheme = "https" if transport.get_extra_info("sslcontext") is not None else "http"
            if not deps.origins.allows(origin, host=head.headers.get("host"), scheme=scheme):
                return None  # refused (forbidden, counted) by the HTTP middleware
        chosen = choose_subprotocol(offered)
        response = rfc6455.upgrade_response(head, chosen)
        if response is None:
            return None
        transport.write(response)
        protocol = LeanWebSocket(transport, deps.transport.max_ws_message_bytes)
        protocol.session = WsSession(deps, transport, chosen, frames=self.frames, sink=protocol)
        deps.streams.sockets.add(protocol.session)
        return protocol

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Negotiate and run one session over aiohttp (an upgrade on a reused connection)."""
        deps = self.deps
        offered = request.headers.get("Sec-WebSocket-Protocol") or ""
        refusal = self._refusal(offered)
        if refusal is not None:
            headers = None
            if isinstance(refusal, UpgradeRequired):
                deps.metrics.refused.inc(refusal.code, "ws")
                headers = {"Sec-WebSocket-Protocol": SUBPROTOCOL_HEADER}
            return error_response(refusal, headers=headers)
        chosen = choose_subprotocol(offered)
        ws = web.WebSocketResponse(
            protocols=(chosen,) if chosen else (),
            autoping=False,
            compress=False,
            max_msg_size=deps.transport.max_ws_message_bytes,
            timeout=2.0,
        )
        await ws.prepare(request)
        assert request.transport is not None
        sink = AiohttpSink(request.transport, request.protocol, request.writer)
        session = WsSession(deps, request.transport, chosen, frames=self.frames, sink=sink)
        deps.streams.sockets.add(session)
        task = asyncio.current_task()
        if task is not None:
            deps.streams.add(task)
        try:
            while not (session.closing or session.transport.is_closing()):
                msg = await ws.receive()
                if msg.type not in _SESSION_MESSAGES:  # closed, closing or failed
                    too_big = getattr(msg.data, "code", 0) == CLOSE_TOO_BIG
                    if msg.type == WSMsgType.ERROR and too_big:
                        session.protocol_error(CLOSE_TOO_BIG, "message too big")
                    elif msg.type == WSMsgType.CLOSE and session.close_code is None:
                        session.close_code = ws.close_code
                    break
                try:
                    if msg.type == WSMsgType.PING:
                        session.on_ping(msg.data)
                    elif msg.type == WSMsgType.PONG:
                        session.on_pong()
                    else:
                        session.on_message(msg.data, binary=msg.type == WSMsgType.BINARY)
                except Exception:
                    session.internal_error()
        finally:
            session.finish()
        return ws
