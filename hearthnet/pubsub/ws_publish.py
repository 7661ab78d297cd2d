"""``publish`` frames of WebSocket sessions (spec §6.4): checked at once, queued on the log
a group per session and loop turn (:meth:`~hearthnet.pubsub.service.PubSub.submit_many`),
and answered with ``published.ok`` once durable, or an ``error`` carrying the frame's
``ref``.

A frame's own checks (payload size, permission, rate limit) run when it is read, so a
refused publish is answered at once. The publishes a session sent in one loop turn (one
read of its socket, or several) that pass them are queued together, at the end of the
turn, as one entry of the log's queue with one answer: no future, pending entry or
callback per publish. The log calls :func:`answer` in the loop turn of the commit that
decided the group's last publish, before it hands the commit to fan-out, so the
group's ``published.ok`` frames are queued on the session at once and leave in one write,
ahead of the deliveries of the same commit: at one publish in flight the publisher's
next publish is on its way while the node writes to the subscribers. When the log's
queue cannot take a group (``max_pending``), each of its publishes is answered
``unavailable`` with ``retry_after_ms``.

A publish with an ``idempotency_key`` (:mod:`hearthnet.pubsub.idempotency`) claims its
key when it is read: a duplicate is not queued, and gets ``published.ok`` with
``duplicate: true`` and its own ``ref`` at once (a key committed within the window) or
when the first publish with that key is committed (one in flight). A first publish goes
with its group, which settles its key in the group's answer.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from hearthnet.errors import InternalError, WireError
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.frames import Publish
from hearthnet.pubsub.idempotency import PublishKeys, Receipt
from hearthnet.pubsub.log import PublishItem
from hearthnet.pubsub.logcommit import Outcome
from hearthnet.pubsub.wire import control_frame
from hearthnet.transport.websocket import OP_TEXT, frame_head

if TYPE_CHECKING:
    from hearthnet.caller import Caller
    from hearthnet.pubsub.service import PubSub
    from hearthnet.pubsub.subscriber import Subscriber
    from hearthnet.pubsub.ws import WsSession


def _ok(ref: str | None, stored: StoredMessage) -> dict[str, Any]:
    """The data of a ``published.ok`` frame."""
    fields = stored.fields
    if fields is not None:  # signed here: no Message made for the answer
        return {
            "ref": ref,
            "id": fields["id"],
            "seq": stored.seq,
            "origin_seq": fields["origin_seq"],
            "ts": fields["ts"],
        }
    msg = stored.message
    return {"ref": ref, "id": msg.id, "seq": stored.seq, "origin_seq": msg.origin_seq, "ts": msg.ts}


def _error(ref: str | None, outcome: Exception) -> dict[str, Any]:
    """The data of the ``error`` frame that answers a refused publish."""
    error = (
        outcome
        if isinstance(outcome, WireError)
        else InternalError("the message log could not store this message")
    )
    return {**error.to_frame_data(), "ref": ref}


# ``published.ok`` as a WebSocket text frame, written from its parts: the bytes
# ``control_frame("ws_text", "published.ok", _ok(ref, stored))`` makes (orjson's, keys in
# this order), without a dict and an encoder call per publish.
_OK_TEXT = b'{"event":"published.ok","data":{"ref":%b,"id":"%b","seq":%d,"origin_seq":%d,"ts":%d}}'
_TEXT_HEADS = [frame_head(n, OP_TEXT) for n in range(126)]  # one-byte lengths


def published_ok_text(ref: str | None, stored: StoredMessage) -> bytes:
    """The ``published.ok`` frame answering ``ref`` for a ``ws_text`` session."""
    fields = stored.fields
    if fields is not None:
        msg_id, origin_seq, ts = fields["id"], fields["origin_seq"], fields["ts"]
    else:
        msg = stored.message
        msg_id, origin_seq, ts = msg.id, msg.origin_seq, msg.ts
    body = _OK_TEXT % (
        b"null" if ref is None else orjson.dumps(ref),
        msg_id.encode(),  # a ULID: nothing to escape
        stored.seq,
        origin_seq,
        ts,
    )
    n = len(body)
    return (_TEXT_HEADS[n] if n < 126 else frame_head(n, OP_TEXT)) + body


def answer(sub: Subscriber, refs: list[str | None], outcomes: list[Outcome]) -> None:
    """Queue the answers to a group of ``sub``'s publishes (``refs``, in order) and have
    them flushed together (called by the log once each is committed or refused). A
    ``ws_text`` session's answers are made as bytes and queued as one."""
    if sub.closed:
        return
    if sub.form == "ws_text":
        frames = []
        for ref, outcome in zip(refs, outcomes, strict=True):
            if isinstance(outcome, StoredMessage):
                frames.append(published_ok_text(ref, outcome))
            elif outcome is not None:  # None: a duplicate, never for a local publish
                frames.append(control_frame("ws_text", "error", _error(ref, outcome)))
        if frames:  # control frames, queued as send_control queues them (not counted)
            sub.channel.out.append(b"".join(frames))
    else:
        send = sub.send_control
        for ref, outcome in zip(refs, outcomes, strict=True):
            if isinstance(outcome, StoredMessage):
                send("published.ok", _ok(ref, outcome))
            elif outcome is not None:
                send("error", _error(ref, outcome))
    sub.wake()


def answer_keyed(
    keyed: tuple[PublishKeys, str, dict[int, str]],
    sub: Subscriber,
    refs: list[str | None],
    outcomes: list[Outcome],
) -> None:
    """:func:`answer`, after settling the keys of the group's publishes that carried
    one (``keyed``: the keys, the owner, and index in the group → key), whether or not
    the session is still there: a duplicate waiting for one of them, maybe on another
    session, gets its answer, and a retry after a lost answer finds the receipt."""
    keys, owner, indexes = keyed
    now = time.monotonic()
    for index, key in indexes.items():
        keys.settle(owner, key, outcomes[index], now)
    answer(sub, refs, outcomes)


def _reply_duplicate(sub: Subscriber, ref: str | None, outcome: Receipt | Exception) -> None:
    """Answer a duplicate publish of ``sub`` with its first's receipt or refusal."""
    if sub.closed:
        return
    if isinstance(outcome, Receipt):
        sub.send_control("published.ok", {"ref": ref, **outcome.answer()})
    else:
        sub.send_control("error", _error(ref, outcome))
    sub.wake()


def _duplicate(keys: PublishKeys, caller: Caller, sub: Subscriber, frame: Publish) -> bool:
    """Claim the key of a keyed publish: False for the first (it is published), True for
    a duplicate, answered now (committed) or once the first is settled (in flight)."""
    assert frame.key is not None
    claimed = keys.claim(caller.owner, frame.key, time.monotonic())
    if claimed is None:
        return False
    if isinstance(claimed, Receipt):
        _reply_duplicate(sub, frame.ref, claimed)
    else:
        claimed.append(partial(_reply_duplicate, sub, frame.ref))
    return True


class _Turn:
    """One session's publishes of this loop turn, waiting to be queued as a group."""

    __slots__ = ("caller", "items", "keyed", "refs", "sender", "session")

    def __init__(self, session: WsSession, caller: Caller) -> None:
        self.session = session
        self.refs: list[str | None] = []
        self.items: list[PublishItem] = []
        self.keyed: dict[int, str] | None = None  # index → idempotency key, when any
        self.caller = caller
        self.sender = caller.sender  # one dict for the group (a token refresh makes another)


class WsPublisher:
    """The ``publish`` frames of every WebSocket session of a node."""

    __slots__ = ("_scheduled", "_turns", "service")

    def __init__(self, service: PubSub) -> None:
        self.service = service
        self._turns: dict[WsSession, _Turn] = {}
        self._scheduled = False

    def publish(self, session: WsSession, frame: Publish) -> None:
        """Check ``frame`` (topic, type and TTL were validated by its parse) and add it to
        the session's group of this loop turn; the group is queued on the log at the end
        of the turn and answered once committed.

        Raises:
            PayloadTooLarge, Forbidden, RateLimited: refused before the log (the session
                answers at once with an ``error``).
        """
        sub, caller = session.sub, session.caller
        assert caller is not None
        assert sub is not None
        self.service.authorize_publish(caller, frame.topic, frame.data, sub)
        if frame.key is not None and _duplicate(self.service.keys, caller, sub, frame):
            return  # answered now, or once its first publish is decided
        turn = self._turns.get(session)
        if turn is None:
            turn = self._turns[session] = _Turn(session, caller)
            if not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self.flush)
        elif turn.caller is not caller:  # a refreshed token within the turn
            turn.caller, turn.sender = caller, caller.sender
        topic, msg_type, data, ttl_s, ref, key = frame
        if key is not None:
            if turn.keyed is None:
                turn.keyed = {}
            turn.keyed[len(turn.refs)] = key
        turn.refs.append(ref)
        turn.items.append((topic, msg_type, data, ttl_s, turn.sender))

    def flush(self) -> None:
        """Queue each session's group of this loop turn on the log (one entry and one
        answer per group); a group the log's queue cannot take is refused whole, each
        publish with its ``ref``. A session that ended meanwhile still has its publishes
        committed (they were accepted); only their answers go nowhere."""
        self._scheduled = False
        turns, self._turns = self._turns, {}
        submit, keys = self.service.submit_many, self.service.keys
        for turn in turns.values():
            sub = turn.session.sub
            assert sub is not None
            keyed = turn.keyed
            try:
                if keyed is None:
                    submit(turn.items, answer=partial(answer, sub, turn.refs))
                else:
                    settles = (keys, turn.caller.owner, keyed)
                    submit(turn.items, answer=partial(answer_keyed, settles, sub, turn.refs))
            except WireError as exc:  # unavailable: the queue is full or the node stops
                if keyed is not None:
                    for key in keyed.values():
                        keys.settle(turn.caller.owner, key, exc, time.monotonic())
                turn.session.deps.metrics.refused.inc(exc.code, "ws", amount=len(turn.refs))
                if not sub.closed:
                    for ref in turn.refs:
                        sub.send_control("error", _error(ref, exc))
                    sub.wake()
        # This is the end of the loop turn already: the log commits a lone small group
        # here (sync = normal) instead of in a loop turn of its own.
        self.service.log.end_turn()
