"""A ``publish`` frame of a WebSocket session (spec §6.4): through the service's one
publish path (:meth:`~hearthnet.pubsub.service.PubSub.submit`: checks, then the log), and
answered with ``published.ok`` once durable, or an ``error`` carrying the frame's ``ref``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from hearthnet.errors import WireError
from hearthnet.pubsub.frames import Publish

if TYPE_CHECKING:
    from hearthnet.pubsub.ws import WsSession


def publish(session: WsSession, frame: Publish) -> None:
    """Submit ``frame`` (topic, type and TTL were validated by its parse); the answer goes
    out when the log committed it (frames already queued for the session go first)."""
    assert session.caller is not None
    fut = session.deps.service.submit(
        session.caller,
        frame.topic,
        frame.msg_type,
        frame.data,
        ttl_s=frame.ttl_s,
        session=session.sub,
    )
    ref = frame.ref

    def reply(done: asyncio.Future[Any]) -> None:
        if session.sub is None or session.sub.closed:
            return
        if done.cancelled():
            return
        exc = done.exception()
        if isinstance(exc, WireError):
            session.send("error", {**exc.to_frame_data(), "ref": ref})
        elif exc is None:
            stored = done.result()
            session.send(
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
