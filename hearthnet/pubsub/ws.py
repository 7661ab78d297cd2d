"""Pub/sub sessions over WebSocket (spec §2.2, §6.5, §3.6): one session's transport,
keepalive, token and close handshake.

A session costs a few small objects and no task while idle: the connection's protocol
(:mod:`hearthnet.pubsub.wsupgrade`) feeds it frames; what client frames do is
:mod:`hearthnet.pubsub.ws_frames` (publish: :mod:`hearthnet.pubsub.ws_publish`); fan-out
writes through the session's sink; pings, missed pongs, idle close and token expiry are
handled for all sessions by one :class:`~hearthnet.pubsub.sweeper.SessionSweeper` task.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hearthnet.auth import Authenticator
from hearthnet.caller import Caller
from hearthnet.config import PubSubSection, TransportSection
from hearthnet.errors import WireError
from hearthnet.pubsub.service import PubSub
from hearthnet.pubsub.sinks import SocketSink
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.sweeper import EXPIRY_REASON, TOKEN_WARNING_MS, SessionSweeper, sweep_token
from hearthnet.sessions import SessionRegistry
from hearthnet.transport import websocket as rfc6455
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOLS, FrameCodec
from hearthnet.transport.cors import OriginPolicy
from hearthnet.transport.keepalive import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    Close,
    Keepalive,
    SendPing,
)
from hearthnet.transport.server import ActiveStreams, ConnectionTracker, TransportMetrics

if TYPE_CHECKING:
    from hearthnet.pubsub.ws_frames import WsFrames

log = logging.getLogger("hearthnet.pubsub.ws")

PING_FRAME = rfc6455.ws_frame(b"", rfc6455.OP_PING)
CLOSE_LINGER_S = 1.0  # input drained after our close frame before TCP is dropped
CLOSE_INTERNAL_ERROR = 1011
CODECS = {name: FrameCodec(name) for name in SUBPROTOCOLS}  # stateless: shared by sessions


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


class WsSession:
    """One pub/sub WebSocket, fed frame by frame (no task of its own while idle).

    The socket is either served by :class:`LeanWebSocket` (a connection whose first request
    is the upgrade) or by aiohttp's WebSocket response (an upgrade on a reused keep-alive
    connection); both call :meth:`on_message`, :meth:`on_ping`, :meth:`on_pong`,
    :meth:`on_close`, :meth:`protocol_error` and finally :meth:`finish`. Frames go straight
    to the transport.
    """

    __slots__ = (
        "_due",
        "_token_due_ms",
        "auth_deadline",
        "caller",
        "close_code",
        "closing",
        "codec",
        "deps",
        "finished",
        "form",
        "frames",
        "keepalive",
        "loop",
        "session_key",
        "sink",
        "sub",
        "tasks",
        "token_end",
        "token_exp_ms",
        "transport",
        "warned",
    )

    def __init__(
        self,
        deps: PubSubDeps,
        transport: asyncio.Transport,
        subprotocol: str | None,
        *,
        frames: WsFrames,
        sink: SocketSink,
    ) -> None:
        self.deps = deps
        self.frames = frames
        self.transport = transport
        self.sink = sink  # fan-out's way into the transport (paused and resumed by it)
        self.codec = CODECS[subprotocol or SUBPROTOCOLS[0]]
        self.form = "ws_cbor" if subprotocol == SUBPROTOCOL_CBOR else "ws_text"
        self.loop = asyncio.get_running_loop()
        cfg = deps.transport
        self.keepalive = Keepalive(
            now=self.loop.time(),
            ping_s=cfg.ws_ping_s,  # presence members more often: see in_presence
            missed_pongs=cfg.ws_missed_pongs,
            idle_s=cfg.ws_idle_s,
        )
        self.sub: Subscriber | None = None
        self.caller: Caller | None = None
        self.token_exp_ms: int | None = None
        self.token_end = EXPIRY_REASON  # the close reason at token_exp_ms
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
        # until the first frame: dropped once it came, so an idle session keeps none
        self.auth_deadline: AuthDeadline | None = AuthDeadline(self, cfg.ws_first_frame_s)

    # --- sending ----------------------------------------------------------------------

    def write(self, data: bytes) -> bool:
        """Write a frame now, unless our close frame is out or the connection closes."""
        transport = self.transport
        if self.closing or transport.is_closing():  # nothing may follow a close frame
            return False
        transport.write(data)
        return True

    def send(self, event: str, data: dict[str, Any]) -> None:
        """Queue a control frame behind what is already queued."""
        assert self.sub is not None
        self.sub.send_control(event, data)
        self.sub.wake()

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
            self.write(PING_FRAME)
        elif isinstance(action, Close):
            self.hard_close(action.code, action.reason)
            return
        self._due = self.keepalive.next_deadline()
        exp = self.token_exp_ms
        if exp is None:
            self._token_due_ms = 1 << 62
        else:
            self._token_due_ms = exp if self.warned else exp - TOKEN_WARNING_MS

    def expire_token_at(self, deadline_ms: int, reason: str) -> None:
        """A key rotation voided the token: it now ends at ``deadline_ms`` (warned at
        once, closed 4401 then, saying ``reason``) unless the client sends a fresh one."""
        if self.token_exp_ms is None or deadline_ms < self.token_exp_ms:
            self.token_exp_ms = deadline_ms
            self.warned = False
            self.token_changed()
            self.token_end = reason

    def token_changed(self) -> None:
        """A (new) token: its deadlines are looked at on the next sweep; it ends by its
        own expiry (until a rotation says otherwise)."""
        self._token_due_ms = 0
        self.token_end = EXPIRY_REASON

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
            self.sub.sink = None  # the subscriber writes nothing after the close frame
        transport.write(rfc6455.close_frame(code, reason))
        self.closing = True
        # RFC 6455 §7.1.1, RFC 9112 §9.6: closing while the client still sends resets the
        # connection, and the reset can destroy the close frame before the client reads
        # it (it sees 1006). Read and drop its input for a moment (bounded), as the front
        # door does after its own refusals.
        self.loop.call_later(CLOSE_LINGER_S, transport.close)

    # --- receiving --------------------------------------------------------------------

    def on_message(self, payload: bytes | bytearray | str, *, binary: bool) -> None:
        """One complete client message."""
        if self.finished or self.closing or self.transport.is_closing():
            return
        self.keepalive.data(self.loop.time())
        if self.caller is None:
            self.frames.authenticate(self, payload, binary)
            return
        self.frames.receive(self, payload, binary=binary)

    def on_ping(self, payload: bytes | bytearray) -> None:
        """Answer a client's ping."""
        self.write(rfc6455.ws_frame(payload, rfc6455.OP_PONG))

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
        if self.write(rfc6455.close_frame(reply)):
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

    def decode(self, payload: bytes | bytearray | str, binary: bool) -> dict[str, Any]:
        """A client message as a frame dict (JSON or CBOR, bounded)."""
        return self.codec.decode(
            payload, binary=binary, max_bytes=self.deps.transport.max_ws_message_bytes
        )

    # --- life -------------------------------------------------------------------------

    def finish(self) -> None:
        """The socket is gone: release everything the session held (once)."""
        if self.finished:
            return
        self.finished = True
        deps = self.deps
        if self.auth_deadline is not None:
            self.auth_deadline.cancel()
        self.sink.close()
        for task in list(self.tasks or ()):
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

    def task_done(self, task: asyncio.Task[Any]) -> None:
        """A request of the session ended; an idle session keeps no empty set."""
        tasks = self.tasks
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                self.tasks = None

    def in_presence(self) -> None:
        """A presence member that stays silent for presence_silence_s has left (spec §6.6):
        ping it at half that, so a live client's pong always comes in time. Other sessions
        are pinged every ws_ping_s (spec §3.6: 30 s)."""
        ping_s = min(self.deps.transport.ws_ping_s, self.deps.config.presence_silence_s / 2)
        if ping_s < self.keepalive.ping_s:
            self.keepalive.ping_every(ping_s, self.loop.time())
            self._due = min(self._due, self.keepalive.next_deadline())


class AuthDeadline:
    """A session's first frame (``auth``) is due within ``ws_first_frame_s``; a session
    that sends none is closed 1008 ``no auth frame`` (counted as a ``timeout``)."""

    __slots__ = ("session", "timer")

    def __init__(self, session: WsSession, delay_s: float) -> None:
        self.session = session
        self.timer = session.loop.call_later(delay_s, self._expired)

    def cancel(self) -> None:
        """The first frame came (or the session ended): no auth deadline any more."""
        self.timer.cancel()
        self.session.auth_deadline = None

    def _expired(self) -> None:
        session = self.session
        session.auth_deadline = None
        if session.caller is None and not session.finished:
            session.deps.metrics.refused.inc("timeout", "ws")
            session.hard_close(CLOSE_POLICY, "no auth frame")
