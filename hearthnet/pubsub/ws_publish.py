"""``publish`` frames of WebSocket sessions (spec §6.4): through the service's one
publish path (:meth:`~hearthnet.pubsub.service.PubSub.submit`: checks, then the log), and
answered with ``published.ok`` once durable, or an ``error`` carrying the frame's ``ref``.

Each publish is answered by the log itself, in the loop turn of its commit: the log calls
:func:`answer` with the outcome (no future per publish, no done-callback and no loop turn
between the commit and the answer), which queues the frame on the session and asks
fan-out to flush it. The log answers the publishers of a commit before it hands the
commit to fan-out, so the answers and the deliveries of one commit leave in the same
flush, each session's in one write, the publishers' first: at one publish in flight the
publisher's next publish is on its way while the node writes to the subscribers.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from hearthnet.errors import InternalError, WireError
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.frames import Publish
from hearthnet.pubsub.logcommit import Outcome

if TYPE_CHECKING:
    from hearthnet.pubsub.service import PubSub
    from hearthnet.pubsub.subscriber import Subscriber
    from hearthnet.pubsub.ws import WsSession


def _ok(ref: str | None, stored: StoredMessage) -> dict[str, Any]:
    """The data of a ``published.ok`` frame."""
    msg = stored.message
    return {"ref": ref, "id": msg.id, "seq": stored.seq, "origin_seq": msg.origin_seq, "ts": msg.ts}


def answer(sub: Subscriber, ref: str | None, outcome: Outcome) -> None:
    """Queue the answer to the publish ``ref`` of ``sub``'s session and have it flushed
    (called by the log once the publish is committed or refused)."""
    if sub.closed:
        return
    if isinstance(outcome, StoredMessage):
        sub.send_control("published.ok", _ok(ref, outcome))
    elif outcome is None:
        return  # a duplicate: never for a local publish
    else:
        error = (
            outcome
            if isinstance(outcome, WireError)
            else InternalError("the message log could not store this message")
        )
        sub.send_control("error", {**error.to_frame_data(), "ref": ref})
    sub.wake()


class WsPublisher:
    """The ``publish`` frames of every WebSocket session of a node."""

    __slots__ = ("service",)

    def __init__(self, service: PubSub) -> None:
        self.service = service

    def publish(self, session: WsSession, frame: Publish) -> None:
        """Submit ``frame`` (topic, type and TTL were validated by its parse); the answer
        is queued when the log committed it (frames already queued for the session first).

        Raises:
            PayloadTooLarge, Forbidden, RateLimited, Unavailable: refused before the log
                (the session answers at once with an ``error``).
        """
        sub = session.sub
        assert session.caller is not None
        assert sub is not None
        self.service.submit(
            session.caller,
            frame.topic,
            frame.msg_type,
            frame.data,
            ttl_s=frame.ttl_s,
            session=sub,
            answer=partial(answer, sub, frame.ref),
        )
