"""One subscribing session (WebSocket, SSE or long-poll) as fan-out sees it.

A :class:`Subscriber` holds a session's patterns, rights and flow-control channel, and
writes what the channel lets out through a :class:`Sink`: the I/O layer's end of the
session (a socket, an SSE stream, a long-poll response; see :mod:`hearthnet.pubsub.sinks`).
The sink says when its transport is full (the channel stops letting frames out) and calls
the subscriber's :meth:`Subscriber.resume` when the transport drained.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Set
from typing import Any, Protocol

from hearthnet.caller import Caller
from hearthnet.errors import BadRequest
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.channel import ChannelState, SubscriberChannel
from hearthnet.pubsub.log import ConsumerRecord
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.pubsub.wire import TopicBatch, control_frame, lean_form, message_form
from hearthnet.transport.direct import SharedBytes

CACHED_TOPICS = 4096  # per-topic permission decisions a session remembers
_CATCHING_UP = ChannelState.CATCHING_UP  # an Enum member read from its class is slow on 3.11
_NO_TOPICS: frozenset[str] = frozenset()


class Resumable(Protocol):
    """Whom a sink tells that its transport drained."""

    def resume(self) -> None:
        """Deliver again."""


class Sink(Protocol):
    """Where a subscriber's frames go (the I/O layer).

    ``stream``: a byte stream whose frames count as delivered when written, and to which a
    batch may go as one shared bytes object; a long-poll (False) collects frames and counts
    what its response returns. ``paused``: the transport is above its high-water mark (the
    subscriber stops letting frames out until the sink calls ``subscriber.resume()``).
    """

    stream: bool
    paused: bool
    subscriber: Resumable | None

    def write(self, frames: list[bytes], shared: SharedBytes | None = None) -> bool:
        """Send ``frames`` in order; False when they went nowhere (the connection is
        closing) or are held for a response (long-poll). ``shared``: bytes that other
        sessions get in this loop turn too (a socket may send them from one file)."""


class Flusher(Protocol):
    """What a subscriber asks of fan-out (:class:`hearthnet.pubsub.fanout.FanOut`)."""

    def wake(self, sub: Subscriber) -> None:
        """Flush ``sub`` this loop turn."""

    def count_sent(self, messages: int, gaps: int) -> None:
        """Frames written to subscribers (metrics)."""


class Subscriber:
    """One subscribing session (WebSocket, SSE or long-poll) as fan-out sees it.

    Slotted, and what most sessions never use (presence, a publish cache, a lock, a room
    waiter) is made on first use: a node holds one per idle subscriber (spec §11).
    """

    __slots__ = (
        "_allowed",
        "_may_publish",
        "_presence",
        "_room_waiter",
        "_subscribing",
        "_turns",
        "caller",
        "channel",
        "client_id",
        "closed",
        "consumer",
        "fanout",
        "fields",
        "filtered",
        "flush_scheduled",
        "form",
        "gaps_reported",
        "last_write",
        "msg_form",
        "on_taken_over",
        "patterns",
        "refill_task",
        "sink",
        "stream",
        "verify",
    )

    def __init__(
        self,
        *,
        caller: Caller,
        client_id: str,
        form: str,
        channel: SubscriberChannel,
        sink: Sink | None,
        on_taken_over: Callable[[int, str], None] | None = None,
        verify: bool = False,
    ) -> None:
        self.caller = caller
        self.client_id = client_id
        self.form = form  # control frames; message frames take msg_form
        # spec §6.2: messages carry sig only for a subscriber that asked to verify.
        self.verify = verify
        self.msg_form = message_form(form, verify)
        self.fields: tuple[str, ...] | None = None  # lean message frames (ask_fields)
        self.channel = channel
        self.sink = sink  # None once nothing may be written (after a close frame)
        if sink is not None:
            sink.subscriber = self
        self.stream = sink is None or sink.stream
        self.on_taken_over = on_taken_over  # durable consumer taken over: CLOSE_TAKEN_OVER
        self.fanout: Flusher | None = None
        self.patterns: dict[str, TopicPattern] = {}
        self.filtered = False
        self._allowed: dict[str, bool] | None = None  # made on first use (filtered sessions)
        self._may_publish: dict[str, bool] | None = None  # made on first publish
        self.consumer: ConsumerRecord | None = None
        self._presence: set[str] | None = None  # topics this session is present on
        self.flush_scheduled = False
        self.closed = False
        self.last_write = time.monotonic()
        self.gaps_reported = 0
        # The catch-up task waits here while the channel has no room for backlog (a future
        # made on demand: an asyncio.Event per idle subscriber costs ~800 bytes).
        self._room_waiter: asyncio.Future[None] | None = None
        # Subscribes of one session run one at a time (made on first subscribe; kept by
        # SubscribeTurn).
        self._subscribing: asyncio.Lock | None = None
        self._turns = 0  # subscribes holding or waiting for the lock
        # A durable consumer reading what overflowed its queue back from the log.
        self.refill_task: asyncio.Task[None] | None = None

    @property
    def presence_topics(self) -> Set[str]:
        """Topics this session is present on (spec §6.6)."""
        return self._presence or _NO_TOPICS

    def join_presence(self, topic: str) -> None:
        """This session is now present on ``topic``."""
        if self._presence is None:
            self._presence = set()
        self._presence.add(topic)

    def leave_presence(self, topic: str) -> None:
        """This session is no longer present on ``topic``."""
        if self._presence is not None:
            self._presence.discard(topic)
            if not self._presence:
                self._presence = None

    @property
    def subscribing(self) -> SubscribeTurn:
        """Held while :meth:`PubSub.subscribe` works on this session (``async with``)."""
        return SubscribeTurn(self)

    def ask_verify(self) -> None:
        """From now on, message frames carry ``sig`` (a session cannot go back).

        Raises:
            BadRequest: the session asked for lean frames (``fields``): ``sig`` signs
                every field, so it cannot be checked on a lean frame.
        """
        if self.fields is not None:
            raise BadRequest("verify: true on a session with subscribe.fields (sig signs all)")
        self.verify = True
        self.msg_form = self.form

    def ask_fields(self, fields: tuple[str, ...]) -> None:
        """From now on, message frames carry only ``fields`` of the envelope (given once
        per session; the same list again is accepted).

        Raises:
            BadRequest: the session asked to verify, or named other fields before.
        """
        if self.verify:
            raise BadRequest("subscribe.fields on a session that asked to verify (sig signs all)")
        if self.fields is not None and self.fields != fields:
            raise BadRequest("subscribe.fields is set once per session")
        self.fields = fields
        self.msg_form = lean_form(self.form, fields)

    def allows(self, topic: str, policy: AccessPolicy) -> bool:
        """Whether ``topic`` may be delivered to this session (cached per topic)."""
        cache = self._allowed
        if cache is None:
            cache = self._allowed = {}
        allowed = cache.get(topic)
        if allowed is None:
            if len(cache) > CACHED_TOPICS:
                cache.clear()
            allowed = cache[topic] = policy.may_receive(self.caller, topic)
        return allowed

    def may_publish(self, topic: str, policy: AccessPolicy) -> bool:
        """Whether this session may publish to ``topic`` (cached per topic: the rules and
        the caller are fixed until :meth:`reauthorize`)."""
        cache = self._may_publish
        if cache is None:
            cache = self._may_publish = {}
        allowed = cache.get(topic)
        if allowed is None:
            if len(cache) > CACHED_TOPICS:
                cache.clear()
            allowed = cache[topic] = policy.may_publish(self.caller, topic)
        return allowed

    def reauthorize(self, caller: Caller, policy: AccessPolicy) -> None:
        """A refreshed token: every current pattern must still be allowed, and what is
        delivered follows the new caller's rights (nothing cached from the old one).

        Raises:
            Forbidden: the new credentials do not cover a current subscription (then
                nothing changes).
        """
        filtered = False
        for pattern in self.patterns.values():
            filtered = policy.check_subscribe(caller, pattern.text) or filtered
        self.caller, self.filtered = caller, filtered
        self._allowed = None
        self._may_publish = None

    def deliver_batch(self, group: TopicBatch, policy: AccessPolicy) -> None:
        """Offer one topic's messages of a committed batch (fan-out hot path)."""
        if self.filtered and not self.allows(group.topic, policy):
            return
        if self.stream:  # a byte stream: the batch may go as one shared bytes
            self.channel.offer_many(*group.stream(self.msg_form))
        else:  # long-poll collects frames one by one
            self.channel.offer_many(*group.form(self.msg_form))

    def deliver_merged(self, groups: list[TopicBatch], policy: AccessPolicy) -> None:
        """Several topics of one batch, merged back into seq order."""
        pairs: list[tuple[int, bytes]] = []
        for group in groups:
            if not self.filtered or self.allows(group.topic, policy):
                seqs, frames = group.form(self.msg_form)
                pairs.extend(zip(seqs, frames, strict=True))
        pairs.sort(key=lambda pair: pair[0])
        self.channel.offer_many([p[0] for p in pairs], [p[1] for p in pairs])

    async def wait_room(self) -> None:
        """Until :meth:`notify_room` (the channel may take backlog again, or it closed)."""
        waiter = self._room_waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._room_waiter = None

    def notify_room(self) -> None:
        """Wake the catch-up task if it waits for room."""
        if self._room_waiter is not None and not self._room_waiter.done():
            self._room_waiter.set_result(None)

    def wake(self) -> None:
        """Ask fan-out to flush this subscriber soon."""
        if self.fanout is not None:
            self.fanout.wake(self)

    def send_control(self, event: str, data: dict[str, Any]) -> None:
        """Queue a non-message frame (written with the next flush)."""
        self.channel.out.append(control_frame(self.form, event, data))

    def flush(self) -> int:
        """Write what the channel lets out, counted in the node's metrics; returns how
        many message frames went."""
        sent = self.write_out()
        if self.fanout is not None:
            self.fanout.count_sent(sent, self.take_gaps())
        return sent

    def take_gaps(self) -> int:
        """Gap frames made since the last call (made when the channel pumps, on offer or
        on ack; counted when written). A long-poll counts what its response returns."""
        made = self.channel.gaps_total - self.gaps_reported
        self.gaps_reported = self.channel.gaps_total
        return made if self.stream else 0

    def write_out(self, now: float | None = None, shared: SharedBytes | None = None) -> int:
        """Write what the channel lets out (uncounted); returns how many message frames
        went to a byte stream. ``now``: the monotonic time, if the caller has it (fan-out
        reads it once per flush); ``shared``: a commit's batches other subscribers get too
        (fan-out's, for this flush)."""
        self.flush_scheduled = False
        if self.closed:
            return 0
        channel = self.channel
        frames = channel.out
        if frames:  # what channel.take() does, inline (every subscriber, every flush)
            count = channel.out_count
            channel.out = []
            channel.out_count = 0
        else:
            count = 0
        if channel.state is _CATCHING_UP and channel.backlog_room:
            self.notify_room()
        sink = self.sink
        if not frames or sink is None:
            return 0
        if not sink.write(frames, shared):
            return 0
        self.last_write = time.monotonic() if now is None else now
        if sink.paused:
            channel.set_writable(False)  # until the sink's transport drains (resume)
        return count

    def resume(self) -> None:
        """The sink's transport drained below its low-water mark: deliver again."""
        if self.closed:
            return
        self.channel.set_writable(True)
        self.flush()


class SubscribeTurn:
    """``async with sub.subscribing``: the subscribes of one session, one at a time; the
    lock exists only while one runs or waits."""

    __slots__ = ("sub",)

    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub

    async def __aenter__(self) -> None:
        lock = self._enter()
        try:
            await lock.acquire()
        except BaseException:
            self._leave(held=False)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._leave(held=True)

    def _enter(self) -> asyncio.Lock:
        """The lock a subscribe waits for."""
        sub = self.sub
        if sub._subscribing is None:
            sub._subscribing = asyncio.Lock()
        sub._turns += 1
        return sub._subscribing

    def _leave(self, *, held: bool) -> None:
        """A subscribe is done (``held``), or was cancelled while it waited."""
        sub = self.sub
        if held:
            assert sub._subscribing is not None
            sub._subscribing.release()
        sub._turns -= 1
        if not sub._turns:
            sub._subscribing = None  # nobody holds or waits: an idle session keeps no lock
