"""Pub/sub sessions over WebSocket (spec §2.2, §6.5, §3.6), and the sweeper that keeps
every pub/sub session alive, honest and bounded.

A session costs one aiohttp handler task blocked in ``receive()`` and a few small
objects; pings, missed pongs, idle close, token expiry and SSE keepalives are handled for
all sessions by one :class:`SessionSweeper` task instead of a timer task per socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from hearthnet.auth import Authenticator
from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.config import PubSubSection, TransportSection
from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    Unavailable,
    UpgradeRequired,
    WireError,
    WrongFrameType,
)
from hearthnet.ids import new_ulid
from hearthnet.pubsub.channel import SubscriberChannel
from hearthnet.pubsub.frames import (
    AckUpto,
    Auth,
    Ping,
    PresenceUpdate,
    Publish,
    Subscribe,
    Unsubscribe,
    parse_client_frame,
)
from hearthnet.pubsub.service import PubSub, Subscriber
from hearthnet.pubsub.wire import control_frame, ws_frame
from hearthnet.sessions import SessionRegistry
from hearthnet.transport.codec import (
    SUBPROTOCOL_CBOR,
    SUBPROTOCOL_HEADER,
    SUBPROTOCOLS,
    FrameCodec,
    choose_subprotocol,
)
from hearthnet.transport.keepalive import (
    CLOSE_POLICY,
    CLOSE_TOKEN_EXPIRED,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    CLOSE_UNSUPPORTED_DATA,
    Close,
    Keepalive,
    SendPing,
)
from hearthnet.transport.server import (
    ActiveStreams,
    ConnectionTracker,
    TransportMetrics,
    error_response,
)

log = logging.getLogger("hearthnet.pubsub.ws")

OP_CLOSE = 0x8
OP_PING = 0x9
TOKEN_WARNING_MS = 60_000


@dataclass(slots=True)
class PubSubDeps:
    """What pub/sub endpoints need from the node."""

    node_id: str
    transport: TransportSection
    config: PubSubSection
    authenticator: Authenticator
    service: PubSub
    connections: ConnectionTracker
    streams: ActiveStreams
    metrics: TransportMetrics
    sweeper: SessionSweeper
    sessions: SessionRegistry


def close_frame(code: int, reason: str = "") -> bytes:
    """A WebSocket close frame."""
    return ws_frame(struct.pack("!H", code) + reason.encode()[:120], OP_CLOSE)


class SweptSession(Protocol):
    """What the sweeper asks of a session (WebSocket or SSE)."""

    def sweep(self, now: float, wall_ms: int) -> None:
        """Do whatever is due: pings, closes, token warnings, keepalive comments."""


def sweep_token(session: WsSession | Any, wall_ms: int) -> bool:
    """Token expiry for any session with ``token_exp_ms``/``warned``/``sub``/``hard_close``
    (spec §2.2: ``auth.expiring`` 60 s before, close 4401 at expiry). True if it closed."""
    if session.token_exp_ms is None:
        return False
    if wall_ms >= session.token_exp_ms:
        session.hard_close(CLOSE_TOKEN_EXPIRED, "token expired")
        return True
    sub = session.sub
    if (
        not session.warned
        and wall_ms >= session.token_exp_ms - TOKEN_WARNING_MS
        and sub is not None
    ):
        session.warned = True
        sub.send_control("auth.expiring", {"expires_ms": session.token_exp_ms})
        sub.wake()
    return False


class WsSession:
    """One pub/sub WebSocket."""

    def __init__(
        self,
        deps: PubSubDeps,
        request: web.Request,
        ws: web.WebSocketResponse,
        subprotocol: str | None,
    ) -> None:
        self.deps = deps
        self.request = request
        self.ws = ws
        self.codec = FrameCodec(subprotocol or SUBPROTOCOLS[0])
        self.form = "ws_cbor" if subprotocol == SUBPROTOCOL_CBOR else "ws_text"
        self.opcode = WSMsgType.BINARY if subprotocol == SUBPROTOCOL_CBOR else WSMsgType.TEXT
        self.loop = asyncio.get_running_loop()
        cfg = deps.transport
        ping_s = min(cfg.ws_ping_s, deps.config.presence_silence_s / 2)
        self.keepalive = Keepalive(
            now=self.loop.time(),
            ping_s=ping_s,
            missed_pongs=cfg.ws_missed_pongs,
            idle_s=cfg.ws_idle_s,
        )
        self.sub: Subscriber | None = None
        self.caller: Caller | None = None
        self.token_exp_ms: int | None = None
        self.warned = False
        self.close_code: int | None = None
        self.tasks: set[asyncio.Task[Any]] | None = None  # made on first use: most have none
        self.session_key: int | None = None

    # --- sending ----------------------------------------------------------------------

    async def _send_direct(self, event: str, data: dict[str, Any]) -> None:
        payload = self.codec.encode({"event": event, "data": data})
        await self.ws.send_frame(payload, self.opcode)

    def send(self, event: str, data: dict[str, Any]) -> None:
        """Queue a control frame behind what is already queued."""
        assert self.sub is not None
        self.sub.send_control(event, data)
        self.deps.service.wake(self.sub)

    def revoke(self, error: WireError) -> None:
        """The caller (or its token's issuer) was revoked: say so and close (spec §1.5)."""
        if self.sub is not None:
            self.sub.send_control("error", error.to_frame_data())
        self.hard_close(CLOSE_POLICY, error.code)

    def ping(self) -> None:
        """Write a ping control frame."""
        transport = self.request.transport
        if transport is not None and not transport.is_closing():
            transport.write(ws_frame(b"", OP_PING))

    def sweep(self, now: float, wall_ms: int) -> None:
        """Token expiry, then pings, missed pongs and idle close."""
        if sweep_token(self, wall_ms):
            return
        if self.sub is not None and self.sub.patterns:
            self.keepalive.data(now)  # a standing subscription is not idleness
        action = self.keepalive.tick(now)
        if isinstance(action, SendPing):
            self.ping()
        elif isinstance(action, Close):
            self.hard_close(action.code, action.reason)

    def hard_close(self, code: int, reason: str) -> None:
        """Write a close frame and drop the connection (no await: sweeper and takeover use it)."""
        if self.close_code is None:
            self.close_code = code
        transport = self.request.transport
        if transport is not None and not transport.is_closing():
            if self.sub is not None:
                self.sub.flush()
            transport.write(close_frame(code, reason))
            transport.close()

    # --- receiving --------------------------------------------------------------------

    async def _receive(self) -> Any:
        while True:
            msg = await self.ws.receive()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                self.keepalive.data(self.loop.time())
                if self.sub is not None:
                    self.deps.service.heard(self.sub)
                return msg
            if msg.type == WSMsgType.PING:
                await self.ws.pong(msg.data)
            elif msg.type == WSMsgType.PONG:
                self.keepalive.pong()
                if self.sub is not None:
                    self.deps.service.heard(self.sub)
            else:
                if msg.type == WSMsgType.ERROR and getattr(msg.data, "code", None) == CLOSE_TOO_BIG:
                    self.close_code = CLOSE_TOO_BIG
                    self.deps.metrics.refused.inc("payload_too_large", "ws")
                return None

    def _decode(self, msg: Any) -> dict[str, Any]:
        return self.codec.decode(
            msg.data,
            binary=msg.type == WSMsgType.BINARY,
            max_bytes=self.deps.transport.max_ws_message_bytes,
        )

    # --- life -------------------------------------------------------------------------

    async def run(self) -> None:
        """Authenticate, then serve frames until the socket ends."""
        deps = self.deps
        try:
            if not await self._authenticate():
                return
            await self._serve()
        finally:
            for task in self.tasks or ():
                task.cancel()
            if self.sub is not None:
                deps.service.detach(self.sub)
            deps.sweeper.remove(self)
            if self.caller is not None:
                deps.connections.close(self.caller.identity)
            if self.session_key is not None:
                deps.sessions.remove(self.session_key)

    async def _authenticate(self) -> bool:
        deps = self.deps
        try:
            async with asyncio.timeout(deps.transport.ws_first_frame_s):
                msg = await self._receive()
        except TimeoutError:
            deps.metrics.refused.inc("timeout", "ws")
            self.close_code = CLOSE_POLICY
            await self.ws.close(code=CLOSE_POLICY, message=b"no auth frame")
            return False
        if msg is None:
            return False
        deps.sweeper.add(self)
        try:
            frame = parse_client_frame(self._decode(msg))
            if not isinstance(frame, Auth):
                raise BadRequest("the first frame must be auth")
            caller = deps.authenticator.authenticate_session(frame.fields, now_ms())
            deps.connections.open(caller.identity)
        except WireError as exc:
            deps.metrics.refused.inc(exc.code, "ws")
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._send_direct("auth.error", {"code": exc.code, "message": exc.message})
            code = (
                CLOSE_UNSUPPORTED_DATA
                if isinstance(exc, WrongFrameType)
                else (CLOSE_TRY_AGAIN if isinstance(exc, CapacityExceeded) else CLOSE_POLICY)
            )
            self.close_code = code
            await self.ws.close(code=code, message=exc.code.encode())
            return False
        self.caller = caller
        self.session_key = deps.sessions.add(caller, self.revoke)
        client_id = "cl_" + new_ulid().lower()
        window = frame.window or deps.config.default_window
        channel = SubscriberChannel(
            window=window,
            queue_max=deps.config.queue_max,
            catching_up=True,
            encode_gap=self._gap_frame,
        )
        self.sub = Subscriber(
            caller=caller,
            client_id=client_id,
            form=self.form,
            channel=channel,
            transport=self.request.transport,
            on_taken_over=self.hard_close,
        )
        deps.service.register(self.sub)
        ok: dict[str, Any] = {
            "client_id": client_id,
            "identity": caller.owner,
            "window": window,
            "node": deps.node_id,
        }
        if caller.token is not None:
            self.token_exp_ms = caller.token.exp_ms
            ok["expires_ms"] = caller.token.exp_ms
        self.send("auth.ok", ok)
        return True

    async def _serve(self) -> None:
        while True:
            msg = await self._receive()
            if msg is None or not await self._serve_one(msg):
                return
            # An idle session waits in _receive(): it must not keep its last frame alive.
            msg = None

    async def _serve_one(self, msg: Any) -> bool:
        """Handle one client frame; False when the session must end."""
        try:
            await self._handle(parse_client_frame(self._decode(msg)))
        except WrongFrameType as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            self.send("error", exc.to_frame_data())
            self.hard_close(CLOSE_UNSUPPORTED_DATA, exc.code)
            return False
        except WireError as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            data = exc.to_frame_data()
            ref = _ref_of(msg, self)
            if ref is not None:
                data["ref"] = ref
            self.send("error", data)
        return True

    async def _handle(self, frame: Any) -> None:
        service = self.deps.service
        sub = self.sub
        assert sub is not None
        assert self.caller is not None
        if isinstance(frame, AckUpto):
            service.ack(sub, frame.upto)
        elif isinstance(frame, Publish):
            self._publish(frame)
        elif isinstance(frame, Subscribe):
            self._spawn(
                service.subscribe(
                    sub,
                    frame.patterns,
                    since=frame.since,
                    consumer=frame.consumer,
                    presence=frame.presence,
                )
            )
        elif isinstance(frame, Unsubscribe):
            self._spawn(self._unsubscribe(frame))
        elif isinstance(frame, PresenceUpdate):
            service.update_presence(sub, frame.fields, frame.topic)
        elif isinstance(frame, Ping):
            self.send("pong", {"ts": now_ms()})
        elif isinstance(frame, Auth):
            self._refresh(frame)

    async def _unsubscribe(self, frame: Unsubscribe) -> None:
        """After the subscribes sent before it (they may wait for a catch-up): an
        unsubscribe must not overtake the subscribe it undoes."""
        sub = self.sub
        assert sub is not None
        async with sub.subscribing:
            self.deps.service.unsubscribe(sub, frame.patterns)
        self.send("unsubscribed", {"topics": [p.text for p in frame.patterns]})

    def _gap_frame(self, from_seq: int, to_seq: int) -> bytes:
        return control_frame(self.form, "gap", {"from_seq": from_seq, "to_seq": to_seq})

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(self._guard(coro))
        if self.tasks is None:
            self.tasks = set()
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _guard(self, coro: Any) -> None:
        try:
            await coro
        except WireError as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            self.send("error", exc.to_frame_data())

    def _publish(self, frame: Publish) -> None:
        service = self.deps.service
        assert self.caller is not None
        topic, msg_type, ttl = service.check_publish(
            self.caller, frame.topic, frame.msg_type, frame.data, frame.ttl_s
        )
        fut = service.log.publish(
            topic=topic, msg_type=msg_type, data=frame.data, ttl_s=ttl, sender=self.caller.sender
        )
        ref = frame.ref

        def reply(done: asyncio.Future[Any]) -> None:
            if self.sub is None or self.sub.closed:
                return
            if done.cancelled():
                return
            exc = done.exception()
            if isinstance(exc, WireError):
                self.send("error", {**exc.to_frame_data(), "ref": ref})
            elif exc is None:
                stored = done.result()
                self.send(
                    "published.ok",
                    {
                        "ref": ref,
                        "id": stored.message.id,
                        "seq": stored.seq,
                        "origin_seq": stored.message.origin_seq,
                        "ts": stored.message.ts,
                    },
                )

        fut.add_done_callback(reply)

    def _refresh(self, frame: Auth) -> None:
        """A fresh token for the same client (spec §2.2)."""
        assert self.caller is not None
        caller = self.deps.authenticator.authenticate_session(frame.fields, now_ms())
        if caller.owner != self.caller.owner:
            raise BadRequest("a refreshed token must be for the same client (iss and sub)")
        if self.sub is not None:
            self.sub.reauthorize(caller, self.deps.service.policy)
        self.caller = caller
        self.token_exp_ms = caller.token.exp_ms if caller.token is not None else None
        self.warned = False
        self.send(
            "auth.ok",
            {
                "client_id": self.sub.client_id if self.sub else "",
                "identity": caller.owner,
                **({"expires_ms": self.token_exp_ms} if self.token_exp_ms else {}),
            },
        )


def _ref_of(msg: Any, session: WsSession) -> str | None:
    with contextlib.suppress(WireError, AttributeError):
        obj = session._decode(msg)
        ref = obj.get("ref")
        return ref if isinstance(ref, str) else None
    return None


class SessionSweeper:
    """One task for every pub/sub session's timers (pings, pongs, idle, tokens, presence)."""

    def __init__(self, service: PubSub, *, tick_s: float) -> None:
        self.service = service
        self.tick_s = tick_s
        self.sessions: set[SweptSession] = set()

    def add(self, session: SweptSession) -> None:
        """Start looking after a session."""
        self.sessions.add(session)

    def remove(self, session: SweptSession) -> None:
        """Stop looking after a session."""
        self.sessions.discard(session)

    async def run(self) -> None:
        """The sweep loop (owned by the node's task group)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick_s)
            now, wall = loop.time(), now_ms()
            for session in list(self.sessions):
                session.sweep(now, wall)
            self.service.expire_presence()


class PubSubWebSocket:
    """Upgrades ``GET /pubsub/v1/subscribe``."""

    def __init__(self, deps: PubSubDeps) -> None:
        self.deps = deps

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Negotiate and run one session."""
        deps = self.deps
        if not deps.transport.websocket_enabled or deps.connections.full or deps.streams.closing:
            return error_response(
                Unavailable("WebSocket not available now; use SSE", retry_after_ms=1000)
            )
        header = request.headers.get("Sec-WebSocket-Protocol") or ""
        chosen = choose_subprotocol(header)
        if chosen is None and header.strip(" ,"):  # none offered is fine: JSON
            deps.metrics.refused.inc("upgrade_required", "ws")
            return error_response(
                UpgradeRequired(f"supported subprotocols: {SUBPROTOCOL_HEADER}"),
                headers={"Sec-WebSocket-Protocol": SUBPROTOCOL_HEADER},
            )
        ws = web.WebSocketResponse(
            protocols=(chosen,) if chosen else (),
            autoping=False,
            compress=False,
            max_msg_size=deps.transport.max_ws_message_bytes,
            timeout=2.0,
        )
        await ws.prepare(request)
        session = WsSession(deps, request, ws, chosen)
        task = asyncio.current_task()
        if task is not None:
            deps.streams.add(task)
        try:
            await session.run()
        finally:
            code = session.close_code or ws.close_code or 1006
            deps.metrics.ws_closed.inc(str(code))
        return ws
