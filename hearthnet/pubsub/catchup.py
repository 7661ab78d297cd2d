"""Catch-up (spec §6.5, §6.8): where a subscription's backlog starts, reading that backlog
from the log a page at a time as the channel makes room, and refilling a durable
consumer whose live queue overflowed.

The channel (:class:`~hearthnet.pubsub.channel.SubscriberChannel`) keeps backlog and live
frames in order with no gap at the boundary; this module feeds it from the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hearthnet.errors import StorageError, WireError
from hearthnet.metrics import Counter
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.channel import ChannelState
from hearthnet.pubsub.consumers import DurableConsumers
from hearthnet.pubsub.frames import Since, reset_reason
from hearthnet.pubsub.log import PAGE, MessageLog
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.pubsub.wire import EncodedMessage
from hearthnet.transport.keepalive import CLOSE_TRY_AGAIN

log = logging.getLogger("hearthnet.pubsub")

StartPoint = tuple[int, int | None]  # (after_seq, min_ts)


class CatchUp:
    """Backlog and refills for this node's subscribers."""

    def __init__(
        self,
        *,
        log_store: MessageLog,
        policy: AccessPolicy,
        consumers: DurableConsumers,
        refills: Counter,
        detach: Callable[[Subscriber], None],
    ) -> None:
        self.log = log_store
        self.policy = policy
        self.consumers = consumers
        self.refills = refills
        self._detach = detach  # a durable consumer's previous session, taken over

    async def start_point(
        self,
        sub: Subscriber,
        patterns: tuple[TopicPattern, ...],
        since: Since | None,
        consumer: str | None,
        *,
        filtered: bool,
    ) -> StartPoint | None:
        """Where the backlog starts: ``(after_seq, min_ts)``; None after sending ``reset``.
        ``filtered``: some matching topics are hidden from this caller (not counted in
        ``last: N``)."""
        head = self.log.head_seq
        if consumer is not None and since is None:
            return (self.consumers.take(sub, consumer, patterns, self._detach).cursor, None)
        start = await self._since_start(sub, patterns, since, filtered=filtered)
        if start is not None and consumer is not None and not sub.closed:
            # A new consumer starts where its backlog does: what that delivers and is not
            # acked comes again on its next subscribe (spec §6.8, at-least-once).
            after, min_ts = start
            if min_ts is not None:
                first = self.log.reader.matching(
                    list(patterns), after_seq=0, upto_seq=head, min_ts=min_ts, limit=1, now=0
                )
                after = first[0] - 1 if first else head
            self.consumers.take(sub, consumer, patterns, self._detach, start=after)
        return start

    async def _since_start(
        self,
        sub: Subscriber,
        patterns: tuple[TopicPattern, ...],
        since: Since | None,
        *,
        filtered: bool,
    ) -> StartPoint | None:
        """The start point of ``since`` (None: live from the head); None after ``reset``."""
        head = self.log.head_seq
        if since is None:
            return (head, None)
        if since.seq is not None:
            reason = reset_reason(since, self.log.epoch, head)
            if reason is not None:
                # spec §6.5: a cursor from another epoch, or beyond the head of this one,
                # cannot be used; the client resumes from what the node has
                sub.send_control(
                    "reset", {"reason": reason, "epoch": self.log.epoch, "head_seq": head}
                )
                sub.wake()
                return None
            return (since.seq, None)
        if since.ts is not None:
            return (0, since.ts)
        assert since.last is not None
        caller, policy = sub.caller, self.policy
        last = await self.log.reader.read_last(
            list(patterns),
            since.last,
            upto_seq=head,
            keep=(lambda topic: policy.may_receive(caller, topic)) if filtered else None,
        )
        return (last[0].seq - 1 if last else head, None)

    async def run(
        self,
        sub: Subscriber,
        patterns: list[TopicPattern],
        after: int,
        head: int,
        *,
        min_ts: int | None,
        limit: int | None,
    ) -> None:
        """Queue the backlog (after, head] (then what a durable consumer's live queue
        dropped meanwhile), and let the channel go live."""
        channel = sub.channel
        if channel.state is not ChannelState.CATCHING_UP:
            # Only a session's first subscribe has a backlog; its channel started catching up.
            return
        cursor = after
        left = limit
        while True:
            cursor, left = await self._read_backlog(
                sub, patterns, cursor, head, min_ts=min_ts, left=left
            )
            if sub.closed or not channel.refill:
                break
            # A durable consumer's live queue overflowed meanwhile: everything it dropped is
            # newer than ``head`` and already in the log (head moves before fan-out).
            channel.begin_refill()
            self.refills.inc()
            cursor, head = max(cursor, head), self.log.head_seq
        if not sub.closed:
            channel.finish_catch_up()
            sub.wake()

    async def _read_backlog(
        self,
        sub: Subscriber,
        patterns: list[TopicPattern],
        cursor: int,
        head: int,
        *,
        min_ts: int | None,
        left: int | None,
    ) -> tuple[int, int | None]:
        """Queue the matching messages in (cursor, head] as backlog, a page at a time as
        the channel makes room; returns where it stopped and how many it may still add."""
        channel = sub.channel
        while cursor < head and not sub.closed and (left is None or left > 0):
            while channel.backlog_room == 0 and not sub.closed:
                await sub.wait_room()  # the window or the socket is full: acks make room
            want = PAGE if left is None else min(PAGE, left)
            page = await self.log.reader.read_matching(
                patterns, after_seq=cursor, upto_seq=head, min_ts=min_ts, limit=want
            )
            if not page or sub.closed:
                break
            # The cursor and the end-of-backlog test follow what was read, not what this
            # session may see: a page of messages it may not receive is not the end of the
            # backlog (spec §6.5: no gap).
            cursor = page[-1].seq
            exhausted = len(page) < want
            if sub.filtered:
                page = [m for m in page if sub.allows(m.message.topic, self.policy)]
            if page:
                channel.add_backlog([(m.seq, EncodedMessage(m).form(sub.msg_form)) for m in page])
                sub.wake()
                if left is not None:
                    left -= len(page)
            if exhausted:
                break
        return cursor, left

    def start_refill(self, sub: Subscriber) -> None:
        """A durable consumer's queue overflowed: read what it dropped back from the log
        (spec §6.8: at-least-once, no gap while the log still holds the messages)."""
        if sub.refill_task is None and not sub.closed:
            sub.refill_task = asyncio.get_running_loop().create_task(self._refill(sub))

    async def _refill(self, sub: Subscriber) -> None:
        try:
            async with sub.subscribing:  # after a running catch-up, before later subscribes
                channel = sub.channel
                if sub.closed or not channel.refill or channel.state is not ChannelState.LIVE:
                    return  # a catch-up still running took care of it
                after = channel.begin_refill()
                head = self.log.head_seq
                self.refills.inc()
                self.consumers.report_lost(sub)  # what retention removed past the bound
                await self.run(
                    sub, list(sub.patterns.values()), after, head, min_ts=None, limit=None
                )
        except (WireError, StorageError) as exc:
            log.warning("durable consumer refill stopped: %s", exc)
            if sub.on_taken_over is not None:  # the client reconnects and resumes
                sub.on_taken_over(CLOSE_TRY_AGAIN, "refill failed")
        finally:
            sub.refill_task = None
        if sub.channel.refill:  # overflowed again between the catch-up and now
            self.start_refill(sub)
