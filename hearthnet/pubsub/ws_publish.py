"""``publish`` frames of WebSocket sessions (spec §6.4): through the service's one
publish path (:meth:`~hearthnet.pubsub.service.PubSub.submit`: checks, then the log), and
answered with ``published.ok`` once durable, or an ``error`` carrying the frame's ``ref``.

The publishes a session sends in one loop turn (what one read of its socket held) are
answered together: one callback on the last of them, which the log commits last (its
commits keep the order of its queue), then every answer queued at once and one flush.
Before, each publish had a closure, a callback scheduled through the loop and a wake of
its session of its own.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING, Any

from hearthnet.errors import WireError
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.frames import Publish

if TYPE_CHECKING:
    from hearthnet.pubsub.service import PubSub
    from hearthnet.pubsub.ws import WsSession

Pending = tuple[str | None, "asyncio.Future[StoredMessage | None]"]


def _ok(ref: str | None, stored: StoredMessage) -> dict[str, Any]:
    """The data of a ``published.ok`` frame."""
    msg = stored.message
    return {"ref": ref, "id": msg.id, "seq": stored.seq, "origin_seq": msg.origin_seq, "ts": msg.ts}


class WsPublisher:
    """The ``publish`` frames of every WebSocket session of a node, answered per session
    and loop turn."""

    __slots__ = ("_groups", "_scheduled", "service")

    def __init__(self, service: PubSub) -> None:
        self.service = service
        self._groups: dict[WsSession, list[Pending]] = {}
        self._scheduled = False

    def publish(self, session: WsSession, frame: Publish) -> None:
        """Submit ``frame`` (topic, type and TTL were validated by its parse); the answer
        goes out when the log committed it (frames already queued for the session first).

        Raises:
            PayloadTooLarge, Forbidden, RateLimited, Unavailable: refused before the log
                (the session answers at once with an ``error``).
        """
        assert session.caller is not None
        fut = self.service.submit(
            session.caller,
            frame.topic,
            frame.msg_type,
            frame.data,
            ttl_s=frame.ttl_s,
            session=session.sub,
        )
        groups = self._groups
        group = groups.get(session)
        if group is None:
            group = groups[session] = []
        group.append((frame.ref, fut))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._close_groups)

    def _close_groups(self) -> None:
        """The loop turn's reads are done: one callback per session, on its last publish."""
        self._scheduled = False
        groups, self._groups = self._groups, {}
        for session, group in groups.items():
            group[-1][1].add_done_callback(partial(self._answer, session, group))

    def _answer(self, session: WsSession, group: list[Pending], _: object = None) -> None:
        """Queue the answers of ``group`` in order and flush the session once."""
        sub = session.sub
        if sub is None or sub.closed:
            return
        for i, (ref, fut) in enumerate(group):
            if not fut.done():
                # Never while the log commits in queue order; should that change, what
                # is left is answered when this one is done (in order, not lost).
                rest = group[i:]
                fut.add_done_callback(partial(self._answer, session, rest))
                break
            if fut.cancelled():
                continue
            exc = fut.exception()
            if exc is None:
                stored = fut.result()
                if stored is not None:
                    sub.send_control("published.ok", _ok(ref, stored))
            elif isinstance(exc, WireError):
                sub.send_control("error", {**exc.to_frame_data(), "ref": ref})
        sub.wake()
