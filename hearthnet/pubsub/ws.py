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
from hearthnet.pubsub.wire import control_frame
from hearthnet.sessions import SessionRegistry
from hearthnet.transport import websocket as rfc6455
from hearthnet.transport.codec import (
    SUBPROTOCOL_CBOR,
    SUBPROTOCOL_HEADER,
    SUBPROTOCOLS,
    FrameCodec,
    choose_subprotocol,
)
from hearthnet.transport.cors import OriginPolicy
from hearthnet.transport.keepalive import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
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

PING_FRAME = rfc6455.ws_frame(b"", rfc6455.OP_PING)
CLOSE_LINGER_S = 1.0  # input drained after our close frame before TCP is dropped
_SESSION_MESSAGES = frozenset({WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.PING, WSMsgType.PONG})
CLOSE_INTERNAL_ERROR = 1011
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
    origins: OriginPolicy | None = None  # browser pages that may subscribe (security.md)


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
    """One pub/sub WebSocket, fed frame by frame (no task of its own while idle).

    The socket is either served by :class:`LeanWebSocket` (a connection whose first request
    is the upgrade) or by aiohttp's WebSocket response (an upgrade on a reused keep-alive
    connection); both call :meth:`on_message`, :meth:`on_ping`, :meth:`on_pong`,
    :meth:`on_close`, :meth:`protocol_error` and finally :meth:`finish`. Frames go straight
    to the transport.
    """

    __slots__ = (
        "_auth_timer",
        "_due",
        "_token_due_ms",
        "caller",
        "close_code",
        "closing",
        "codec",
        "deps",
        "finished",
        "form",
        "keepalive",
        "loop",
        "session_key",
        "sub",
        "tasks",
        "token_exp_ms",
        "transport",
        "warned",
    )

    def __init__(
        self, deps: PubSubDeps, transport: asyncio.Transport, subprotocol: str | None
    ) -> None:
        self.deps = deps
        self.transport = transport
        self.codec = FrameCodec(subprotocol or SUBPROTOCOLS[0])
        self.form = "ws_cbor" if subprotocol == SUBPROTOCOL_CBOR else "ws_text"
        self.loop = asyncio.get_running_loop()
        cfg = deps.transport
        self.keepalive = Keepalive(
            now=self.loop.time(),
            ping_s=cfg.ws_ping_s,  # presence members more often: see _in_presence
            missed_pongs=cfg.ws_missed_pongs,
            idle_s=cfg.ws_idle_s,
        )
        self.sub: Subscriber | None = None
        self.caller: Caller | None = None
        self.token_exp_ms: int | None = None
        self.warned = False
        self.close_code: int | None = None
        self.closing = False  # our close frame is out: input is read and dropped
        self.tasks: set[asyncio.Task[Any]] | None = None  # made on first use: most have none
        self.session_key: int | None = None
        self.finished = False
        # Until when a sweep has nothing to do (loop clock; wall clock for the token):
        # the sweeper visits every session each tick, so most visits must be a compare.
        # Zero: the first sweep (after auth) looks at everything.
        self._due = 0.0
        self._token_due_ms = 0
        self._auth_timer: asyncio.TimerHandle | None = self.loop.call_later(
            cfg.ws_first_frame_s, self._no_auth
        )

    # --- sending ----------------------------------------------------------------------

    def _write(self, data: bytes) -> bool:
        transport = self.transport
        if self.closing or transport.is_closing():  # nothing may follow a close frame
            return False
        transport.write(data)
        return True

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

    def sweep(self, now: float, wall_ms: int) -> None:
        """Token expiry, then pings, missed pongs and idle close."""
        if now < self._due and wall_ms < self._token_due_ms:
            return  # nothing is due yet (deadlines only move later, except a new token's)
        if sweep_token(self, wall_ms):
            return
        if self.sub is not None and self.sub.patterns:
            self.keepalive.data(now)  # a standing subscription is not idleness
        action = self.keepalive.tick(now)
        if isinstance(action, SendPing):
            self._write(PING_FRAME)
        elif isinstance(action, Close):
            self.hard_close(action.code, action.reason)
            return
        self._due = self.keepalive.next_deadline()
        exp = self.token_exp_ms
        if exp is None:
            self._token_due_ms = 1 << 62
        else:
            self._token_due_ms = exp if self.warned else exp - TOKEN_WARNING_MS

    def expire_token_at(self, deadline_ms: int) -> None:
        """A key rotation voided the token: it now ends at ``deadline_ms`` (warned at
        once, closed 4401 then) unless the client sends a fresh one."""
        if self.token_exp_ms is None or deadline_ms < self.token_exp_ms:
            self.token_exp_ms = deadline_ms
            self.warned = False
            self._token_changed()

    def _token_changed(self) -> None:
        """A (new) token: its deadlines are looked at on the next sweep."""
        self._token_due_ms = 0

    def going_away(self) -> None:
        """Node shutdown (spec §9): what is queued, then close 1001, and the connection
        ends now: no linger outlives the node (a session already lingering after its own
        close frame is ended too)."""
        self.hard_close(CLOSE_GOING_AWAY, "node shutting down")
        self.transport.close()

    def hard_close(self, code: int, reason: str) -> None:
        """Write what is queued and a close frame; drop the connection when the client
        answers the close, closes, or after :data:`CLOSE_LINGER_S`."""
        if self.close_code is None:
            self.close_code = code
        transport = self.transport
        if self.closing or transport.is_closing():
            return
        if self.sub is not None:
            self.sub.flush()
            self.sub.transport = None  # the subscriber writes nothing after the close frame
        transport.write(rfc6455.close_frame(code, reason))
        self.closing = True
        # RFC 6455 §7.1.1, RFC 9112 §9.6: closing while the client still sends resets the
        # connection, and the reset can destroy the close frame before the client reads
        # it (it sees 1006). Read and drop its input for a moment (bounded), as the front
        # door does after its own refusals.
        self.loop.call_later(CLOSE_LINGER_S, transport.close)

    # --- receiving --------------------------------------------------------------------

    def on_message(self, payload: bytes | str, *, binary: bool) -> None:
        """One complete client message."""
        if self.finished or self.closing or self.transport.is_closing():
            return
        self.keepalive.data(self.loop.time())
        if self.caller is None:
            self._authenticate(payload, binary)
            return
        if self.sub is not None:
            self.deps.service.heard(self.sub)
        try:
            self._handle(parse_client_frame(self._decode(payload, binary)))
        except WrongFrameType as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            self.send("error", exc.to_frame_data())
            self.hard_close(CLOSE_UNSUPPORTED_DATA, exc.code)
        except WireError as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            data = exc.to_frame_data()
            ref = self._ref_of(payload, binary)
            if ref is not None:
                data["ref"] = ref
            self.send("error", data)

    def on_ping(self, payload: bytes) -> None:
        """Answer a client's ping."""
        self._write(rfc6455.ws_frame(payload, rfc6455.OP_PONG))

    def on_pong(self) -> None:
        """A pong: the client is alive."""
        self.keepalive.pong()
        if self.sub is not None:
            self.deps.service.heard(self.sub)

    def on_close(self, code: int) -> None:
        """The client closes: answer with the same code and drop the connection."""
        if self.close_code is None:
            self.close_code = code
        if self.closing:  # the client answers our close frame: the handshake is done
            self.transport.close()
            return
        reply = CLOSE_NORMAL if code == rfc6455.CLOSE_NO_STATUS else code
        if self._write(rfc6455.close_frame(reply)):
            self.transport.close()

    def internal_error(self) -> None:
        """Handling an event failed (a bug of ours): say so, end this socket, keep the node.
        Called by either transport from its ``except Exception``."""
        log.exception("pub/sub WebSocket session failed")
        self.deps.metrics.refused.inc("internal_error", "ws")
        self.hard_close(CLOSE_INTERNAL_ERROR, "internal_error")

    def protocol_error(self, code: int, reason: str) -> None:
        """The client broke the protocol or sent a message over the limit."""
        if code == CLOSE_TOO_BIG:
            self.deps.metrics.refused.inc("payload_too_large", "ws")
        self.hard_close(code, reason)

    def _decode(self, payload: bytes | str, binary: bool) -> dict[str, Any]:
        return self.codec.decode(
            payload, binary=binary, max_bytes=self.deps.transport.max_ws_message_bytes
        )

    def _ref_of(self, payload: bytes | str, binary: bool) -> str | None:
        with contextlib.suppress(WireError):
            ref = self._decode(payload, binary).get("ref")
            return ref if isinstance(ref, str) else None
        return None

    # --- life -------------------------------------------------------------------------

    def finish(self) -> None:
        """The socket is gone: release everything the session held (once)."""
        if self.finished:
            return
        self.finished = True
        deps = self.deps
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        for task in self.tasks or ():
            task.cancel()
        if self.sub is not None:
            deps.service.detach(self.sub)
        deps.sweeper.remove(self)
        deps.streams.sockets.discard(self)
        if self.caller is not None:
            deps.connections.close(self.caller.identity)
        if self.session_key is not None:
            deps.sessions.remove(self.session_key)
        deps.metrics.ws_closed.inc(str(self.close_code or 1006))

    def _no_auth(self) -> None:
        self._auth_timer = None
        if self.caller is None and not self.finished:
            self.deps.metrics.refused.inc("timeout", "ws")
            self.hard_close(CLOSE_POLICY, "no auth frame")

    def _authenticate(self, payload: bytes | str, binary: bool) -> None:
        deps = self.deps
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        deps.sweeper.add(self)
        try:
            frame = parse_client_frame(self._decode(payload, binary))
            if not isinstance(frame, Auth):
                raise BadRequest("the first frame must be auth")
            caller = deps.authenticator.authenticate_session(frame.fields, now_ms())
            deps.connections.open(caller.identity)
        except WireError as exc:
            deps.metrics.refused.inc(exc.code, "ws")
            self._write(
                control_frame(self.form, "auth.error", {"code": exc.code, "message": exc.message})
            )
            code = (
                CLOSE_UNSUPPORTED_DATA
                if isinstance(exc, WrongFrameType)
                else (CLOSE_TRY_AGAIN if isinstance(exc, CapacityExceeded) else CLOSE_POLICY)
            )
            self.hard_close(code, exc.code)
            return
        self.caller = caller
        self.session_key = deps.sessions.add(caller, self.revoke, self.expire_token_at)
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
            transport=self.transport,
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

    def _handle(self, frame: Any) -> None:
        service = self.deps.service
        sub = self.sub
        assert sub is not None
        assert self.caller is not None
        if isinstance(frame, AckUpto):
            service.ack(sub, frame.upto)
        elif isinstance(frame, Publish):
            self._publish(frame)
        elif isinstance(frame, Subscribe):
            if frame.verify:
                sub.ask_verify()
            if frame.presence is not None:
                self._in_presence()
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
            self._in_presence()
            service.update_presence(sub, frame.fields, frame.topic)
        elif isinstance(frame, Ping):
            self.send("pong", {"ts": now_ms()})
        elif isinstance(frame, Auth):
            self._refresh(frame)

    def _in_presence(self) -> None:
        """A presence member that stays silent for presence_silence_s has left (spec §6.6):
        ping it at half that, so a live client's pong always comes in time. Other sessions
        are pinged every ws_ping_s (spec §3.6: 30 s)."""
        ping_s = min(self.deps.transport.ws_ping_s, self.deps.config.presence_silence_s / 2)
        if ping_s < self.keepalive.ping_s:
            self.keepalive.ping_every(ping_s, self.loop.time())
            self._due = min(self._due, self.keepalive.next_deadline())

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
        limit = self.deps.config.max_pending_per_session
        if self.tasks is not None and len(self.tasks) >= limit:
            coro.close()  # never started: no "never awaited" warning
            raise CapacityExceeded(f"at most {limit} requests in progress per session")
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
        # parse_client_frame validated topic, type and TTL
        fut = service.submit(
            self.caller,
            frame.topic,
            frame.msg_type,
            frame.data,
            ttl_s=frame.ttl_s,
            session=self.sub,
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
        if self.session_key is not None:
            self.deps.sessions.update(self.session_key, caller)
        self.token_exp_ms = caller.token.exp_ms if caller.token is not None else None
        self.warned = False
        self._token_changed()
        self.send(
            "auth.ok",
            {
                "client_id": self.sub.client_id if self.sub else "",
                "identity": caller.owner,
                **({"expires_ms": self.token_exp_ms} if self.token_exp_ms else {}),
            },
        )


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


class LeanWebSocket(asyncio.Protocol):
    """A pub/sub WebSocket served straight from the transport (spec §11: 20,000 idle
    subscribers in ≤ 15 MiB per 1,000): a frame reader and a session, nothing else."""

    __slots__ = ("reader", "session")

    def __init__(self, session: WsSession, max_message: int) -> None:
        self.session = session
        self.reader = rfc6455.FrameReader(max_message)

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
        session = WsSession(deps, transport, chosen)
        deps.streams.sockets.add(session)
        return LeanWebSocket(session, deps.transport.max_ws_message_bytes)

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
        session = WsSession(deps, request.transport, chosen)
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
