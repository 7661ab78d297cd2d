"""What a pub/sub WebSocket session's client frames do (spec §2.2, §6.5): the first frame
authenticates, then each frame is dispatched to the service: subscribe, unsubscribe, ack,
presence, ping, token refresh, publish (:mod:`hearthnet.pubsub.ws_publish`).

One :class:`WsFrames` serves every session of a node: it keeps no per-session state (a
session is its transport, keepalive and subscriber: :class:`~hearthnet.pubsub.ws.WsSession`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest, CapacityExceeded, WireError, WrongFrameType
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
    fast_ack_upto,
    parse_client_frame,
)
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.wire import control_frame
from hearthnet.pubsub.ws_publish import WsPublisher
from hearthnet.transport.keepalive import CLOSE_POLICY, CLOSE_TRY_AGAIN, CLOSE_UNSUPPORTED_DATA

if TYPE_CHECKING:
    from hearthnet.pubsub.ws import PubSubDeps, WsSession


def _gap_encoder(form: str) -> Callable[[int, int], bytes]:
    def gap_frame(from_seq: int, to_seq: int) -> bytes:
        return control_frame(form, "gap", {"from_seq": from_seq, "to_seq": to_seq})

    return gap_frame


# One gap encoder per transport form, shared by every session's channel.
GAP_FRAME = {form: _gap_encoder(form) for form in ("ws_text", "ws_cbor")}


def ref_of(frame: dict[str, Any]) -> str | None:
    """The client's ``ref`` of a frame, echoed in an error about it."""
    ref = frame.get("ref")
    return ref if isinstance(ref, str) else None


class WsFrames:
    """Client frames of every pub/sub WebSocket session of a node."""

    def __init__(self, deps: PubSubDeps) -> None:
        self.deps = deps
        self.publisher = WsPublisher(deps.service)

    def receive(
        self, session: WsSession, payload: bytes | bytearray | str, *, binary: bool
    ) -> None:
        """One complete client message of an authenticated session; a refused frame is
        answered with an ``error`` (a wrong frame type also closes, spec §2.2)."""
        service = self.deps.service
        sub = session.sub
        if sub is not None:
            service.heard(sub)
            # An ack in the shape clients send: read from its bytes (most client frames at
            # 1,000 subscribers are acks); anything else is decoded and parsed in full.
            max_bytes = self.deps.transport.max_ws_message_bytes
            if binary == session.codec.binary and len(payload) <= max_bytes:
                upto = fast_ack_upto(payload, binary)
                if upto is not None:
                    service.ack(sub, upto)
                    return
        try:
            self._handle(session, parse_client_frame(session.decode(payload, binary)))
        except WrongFrameType as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            session.send("error", exc.to_frame_data())
            session.hard_close(CLOSE_UNSUPPORTED_DATA, exc.code)
        except WireError as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            data = exc.to_frame_data()
            ref = None
            with contextlib.suppress(WireError):
                ref = ref_of(session.decode(payload, binary))
            if ref is not None:
                data["ref"] = ref
            session.send("error", data)

    def authenticate(
        self, session: WsSession, payload: bytes | bytearray | str, binary: bool
    ) -> None:
        """The first frame: ``auth`` (spec §2.2); then the session has its subscriber."""
        deps = self.deps
        if session.auth_deadline is not None:
            session.auth_deadline.cancel()
        deps.sweeper.add(session)
        try:
            frame = parse_client_frame(session.decode(payload, binary))
            if not isinstance(frame, Auth):
                raise BadRequest("the first frame must be auth")
            caller = deps.authenticator.authenticate_session(frame.fields, now_ms())
            deps.connections.open(caller.identity)
        except WireError as exc:
            deps.metrics.refused.inc(exc.code, "ws")
            session.write(
                control_frame(
                    session.form, "auth.error", {"code": exc.code, "message": exc.message}
                )
            )
            code = (
                CLOSE_UNSUPPORTED_DATA
                if isinstance(exc, WrongFrameType)
                else (CLOSE_TRY_AGAIN if isinstance(exc, CapacityExceeded) else CLOSE_POLICY)
            )
            session.hard_close(code, exc.code)
            return
        session.caller = caller
        session.session_key = deps.sessions.add(caller, session.revoke, session.expire_token_at)
        client_id = "cl_" + new_ulid().lower()
        window = frame.window or deps.config.default_window
        channel = SubscriberChannel(
            window=window,
            queue_max=deps.config.queue_max,
            catching_up=True,
            encode_gap=GAP_FRAME[session.form],
        )
        session.sub = Subscriber(
            caller=caller,
            client_id=client_id,
            form=session.form,
            channel=channel,
            sink=session.sink,
            on_taken_over=session.hard_close,
        )
        deps.service.register(session.sub)
        ok: dict[str, Any] = {
            "client_id": client_id,
            "identity": caller.owner,
            "window": window,
            "node": deps.node_id,
        }
        if caller.token is not None:
            session.token_exp_ms = caller.token.exp_ms
            ok["expires_ms"] = caller.token.exp_ms
        session.send("auth.ok", ok)

    def _handle(self, session: WsSession, frame: Any) -> None:
        service = self.deps.service
        sub = session.sub
        assert sub is not None
        assert session.caller is not None
        if isinstance(frame, AckUpto):
            service.ack(sub, frame.upto)
        elif isinstance(frame, Publish):
            self.publisher.publish(session, frame)
        elif isinstance(frame, Subscribe):
            if frame.verify:
                sub.ask_verify()
            if frame.fields is not None:
                sub.ask_fields(frame.fields)
            if frame.presence is not None:
                session.in_presence()
            self._spawn(
                session,
                service.subscribe(
                    sub,
                    frame.patterns,
                    since=frame.since,
                    consumer=frame.consumer,
                    presence=frame.presence,
                ),
            )
        elif isinstance(frame, Unsubscribe):
            self._spawn(session, self._unsubscribe(session, frame))
        elif isinstance(frame, PresenceUpdate):
            session.in_presence()
            service.update_presence(sub, frame.fields, frame.topic)
        elif isinstance(frame, Ping):
            session.send("pong", {"ts": now_ms()})
        elif isinstance(frame, Auth):
            self._refresh(session, frame)

    async def _unsubscribe(self, session: WsSession, frame: Unsubscribe) -> None:
        """After the subscribes sent before it (they may wait for a catch-up): an
        unsubscribe must not overtake the subscribe it undoes."""
        sub = session.sub
        assert sub is not None
        async with sub.subscribing:
            self.deps.service.unsubscribe(sub, frame.patterns)
        session.send("unsubscribed", {"topics": [p.text for p in frame.patterns]})

    def _spawn(self, session: WsSession, coro: Coroutine[Any, Any, None]) -> None:
        """Run a request of the session (bounded per session; cancelled when it ends)."""
        limit = self.deps.config.max_pending_per_session
        if session.tasks is not None and len(session.tasks) >= limit:
            coro.close()  # never started: no "never awaited" warning
            raise CapacityExceeded(f"at most {limit} requests in progress per session")
        task = session.loop.create_task(self._guard(session, coro))
        if session.tasks is None:
            session.tasks = set()
        session.tasks.add(task)
        task.add_done_callback(session.task_done)

    async def _guard(self, session: WsSession, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except WireError as exc:
            self.deps.metrics.refused.inc(exc.code, "ws")
            session.send("error", exc.to_frame_data())

    def _refresh(self, session: WsSession, frame: Auth) -> None:
        """A fresh token for the same client (spec §2.2)."""
        deps = self.deps
        assert session.caller is not None
        caller = deps.authenticator.authenticate_session(frame.fields, now_ms())
        if caller.owner != session.caller.owner:
            raise BadRequest("a refreshed token must be for the same client (iss and sub)")
        if session.sub is not None:
            session.sub.reauthorize(caller, deps.service.policy)
        session.caller = caller
        if session.session_key is not None:
            deps.sessions.update(session.session_key, caller)
        session.token_exp_ms = caller.token.exp_ms if caller.token is not None else None
        session.warned = False
        session.token_changed()
        session.send(
            "auth.ok",
            {
                "client_id": session.sub.client_id if session.sub else "",
                "identity": caller.owner,
                **({"expires_ms": session.token_exp_ms} if session.token_exp_ms else {}),
            },
        )
