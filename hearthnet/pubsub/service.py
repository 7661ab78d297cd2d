"""Pub/sub on one node: publish, fan-out, subscriptions, presence, durable consumers,
retention (spec §6). The asyncio glue around the pure pieces of this package.

Fan-out is designed rather than hoped for (spec §11): :meth:`PubSub.on_commit` runs once
per committed batch; each message is encoded once per transport form
(:class:`~hearthnet.pubsub.wire.EncodedMessage`), every matching subscriber's channel gets
the same bytes, and each subscriber's frames from one loop turn leave in one write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.config import PubSubSection
from hearthnet.errors import BadRequest, Forbidden, RateLimited, StorageError, WireError
from hearthnet.metrics import Counter, MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy, AccessRule
from hearthnet.pubsub.batchsig import VERIFIER
from hearthnet.pubsub.channel import ChannelState, SubscriberChannel
from hearthnet.pubsub.envelope import StoredMessage, encoded_payload, validate_ttl, validate_type
from hearthnet.pubsub.frames import Since, reset_reason
from hearthnet.pubsub.index import SubscriptionIndex
from hearthnet.pubsub.log import PAGE, ConsumerRecord, MessageLog
from hearthnet.pubsub.presence import Member, PresenceEvent, PresenceTable, validate_presence_fields
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.topics import TopicPattern, validate_topic
from hearthnet.pubsub.wire import EncodedMessage, TopicBatch, control_frame, message_form
from hearthnet.ratelimit import RateLimiter
from hearthnet.transport.direct import SocketTransport, plain_socket_fd, write_through
from hearthnet.transport.keepalive import CLOSE_TAKEN_OVER, CLOSE_TRY_AGAIN

log = logging.getLogger("hearthnet.pubsub")

WRITE_HIGH_WATER = 1 << 20  # bytes buffered in a transport before a subscriber is paused
WRITE_LOW_WATER = 256 * 1024
DRAIN_POLL_S = 0.005
AGED_PAGE = 10_000  # retention candidates read at once
AGED_PAGES = 10  # pages of old messages looked at per retention pass


class Transport(SocketTransport, Protocol):
    """The part of an asyncio transport a subscriber writes to."""

    def is_closing(self) -> bool:
        """True once closing."""


@dataclass(slots=True)
class PubSubMetrics:
    """Pub/sub series in ``/metrics`` (spec §9)."""

    published: Counter
    delivered: Counter
    gaps: Counter
    duplicates: Counter
    rate_limited: Counter
    refills: Counter

    @classmethod
    def register(cls, registry: MetricsRegistry, subscribers: Callable[[], float]) -> PubSubMetrics:
        """Create the series."""
        metrics = cls(
            published=registry.counter(
                "hearthnet_pubsub_published_total", "Messages committed to the log.", ("origin",)
            ),
            delivered=registry.counter(
                "hearthnet_pubsub_delivered_total",
                "Message frames handed to subscribers' transports.",
            ),
            gaps=registry.counter(
                "hearthnet_pubsub_gaps_total", "Gap frames sent to slow subscribers."
            ),
            duplicates=registry.counter(
                "hearthnet_gossip_duplicates_total",
                "Messages received again that the log already held.",
            ),
            rate_limited=registry.counter(
                "hearthnet_rate_limited_total", "Requests refused by a rate limit.", ("kind",)
            ),
            refills=registry.counter(
                "hearthnet_pubsub_consumer_refills_total",
                "Times a durable consumer's overflowed queue was read back from the log.",
            ),
        )
        registry.gauge(
            "hearthnet_pubsub_subscribers", "Subscribed sessions on this node.", subscribers
        )

        def signatures() -> dict[tuple[str, ...], float]:
            return {(kind,): float(n) for kind, n in VERIFIER.counts().items()}

        # Counts since the process started, read from the process's verifier at scrape time.
        registry.gauge(
            "hearthnet_pubsub_signature_checks",
            "Message signature checks since start (spec 6.2): batch_signatures (one ed25519 "
            "check per batch root), batch_messages (proved by a Merkle path), "
            "single_signatures.",
            signatures,
            ("kind",),
        )
        return metrics


class Subscriber:
    """One subscribing session (WebSocket, SSE or long-poll) as fan-out sees it."""

    def __init__(
        self,
        *,
        caller: Caller,
        client_id: str,
        form: str,
        channel: SubscriberChannel,
        transport: Transport | None,
        chunked: bool = False,
        on_frames: Callable[[list[bytes]], None] | None = None,
        on_taken_over: Callable[[int, str], None] | None = None,
        verify: bool = False,
    ) -> None:
        self.caller = caller
        self.client_id = client_id
        self.form = form  # control frames; message frames take msg_form
        # spec §6.2: messages carry sig only for a subscriber that asked to verify.
        self.verify = verify
        self.msg_form = message_form(form, verify)
        self.channel = channel
        self.transport = transport
        # Fan-out writes go straight into a plain TCP socket (see transport.direct).
        self.fd = plain_socket_fd(transport) if transport is not None else -1
        self.chunked = chunked  # SSE over HTTP/1.1: we write the chunk framing ourselves
        self.on_frames = on_frames  # long-poll: wake the waiting handler instead of writing
        self.on_taken_over = on_taken_over  # durable consumer taken over: CLOSE_TAKEN_OVER
        self.service: PubSub | None = None
        self.patterns: dict[str, TopicPattern] = {}
        self.filtered = False
        self._allowed: dict[str, bool] = {}
        self._may_publish: dict[str, bool] | None = None  # made on first publish
        self.consumer: ConsumerRecord | None = None
        self.presence_topics: set[str] = set()
        self.flush_scheduled = False
        self.draining = False
        self.closed = False
        self.last_write = time.monotonic()
        self.gaps_reported = 0
        # The catch-up task waits here while the channel has no room for backlog (a future
        # made on demand: an asyncio.Event per idle subscriber costs ~800 bytes).
        self._room_waiter: asyncio.Future[None] | None = None
        # Subscribes of one session run one at a time (made on first subscribe).
        self._subscribing: asyncio.Lock | None = None
        # A durable consumer reading what overflowed its queue back from the log.
        self.refill_task: asyncio.Task[None] | None = None

    @property
    def subscribing(self) -> asyncio.Lock:
        """Held while :meth:`PubSub.subscribe` works on this session."""
        if self._subscribing is None:
            self._subscribing = asyncio.Lock()
        return self._subscribing

    def ask_verify(self) -> None:
        """From now on, message frames carry ``sig`` (a session cannot go back)."""
        self.verify = True
        self.msg_form = self.form

    def allows(self, topic: str, policy: AccessPolicy) -> bool:
        """Whether ``topic`` may be delivered to this session (cached per topic)."""
        allowed = self._allowed.get(topic)
        if allowed is None:
            if len(self._allowed) > 4096:
                self._allowed.clear()
            allowed = self._allowed[topic] = policy.may_receive(self.caller, topic)
        return allowed

    def may_publish(self, topic: str, policy: AccessPolicy) -> bool:
        """Whether this session may publish to ``topic`` (cached per topic: the rules and
        the caller are fixed until :meth:`reauthorize`)."""
        cache = self._may_publish
        if cache is None:
            cache = self._may_publish = {}
        allowed = cache.get(topic)
        if allowed is None:
            if len(cache) > 4096:
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
        self._allowed.clear()
        self._may_publish = None

    def deliver_batch(self, group: TopicBatch, policy: AccessPolicy) -> None:
        """Offer one topic's messages of a committed batch (fan-out hot path)."""
        if self.filtered and not self.allows(group.topic, policy):
            return
        seqs, frames = group.form(self.msg_form)
        if self.on_frames is None:  # a byte stream: the batch may go as one shared bytes
            self.channel.offer_many(seqs, frames, partial(group.joined, self.msg_form))
        else:  # long-poll collects frames one by one
            self.channel.offer_many(seqs, frames)

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
        """Ask the service to flush this subscriber soon."""
        if self.service is not None:
            self.service.wake(self)

    def send_control(self, event: str, data: dict[str, Any]) -> None:
        """Queue a non-message frame (written with the next flush)."""
        self.channel.out.append(control_frame(self.form, event, data))

    def flush(self) -> int:
        """Write what the channel lets out, counted in the node's metrics; returns how
        many message frames went."""
        sent = self.write_out()
        if self.service is not None:
            self.service.count_sent(sent, self.take_gaps())
        return sent

    def take_gaps(self) -> int:
        """Gap frames made since the last call (made when the channel pumps, on offer or
        on ack; counted when written). A long-poll counts what its response returns."""
        made = self.channel.gaps_total - self.gaps_reported
        self.gaps_reported = self.channel.gaps_total
        return made if self.on_frames is None else 0

    def write_out(self) -> int:
        """Write what the channel lets out (uncounted); returns how many message frames
        went."""
        self.flush_scheduled = False
        if self.closed:
            return 0
        count = self.channel.out_count
        frames = self.channel.take()
        if self.channel.state is ChannelState.CATCHING_UP and self.channel.backlog_room:
            self.notify_room()
        if not frames:
            return 0
        if self.on_frames is not None:  # a long-poll: it counts what its response returns
            self.on_frames(frames)
            return 0
        transport = self.transport
        if transport is None or transport.is_closing():
            return 0
        self.last_write = time.monotonic()
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        if self.chunked:
            data = b"%x\r\n" % len(data) + data + b"\r\n"
        write_through(transport, self.fd, data)
        if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self.channel.set_writable(False)
            self._start_drain_poll()
        return count

    def _start_drain_poll(self) -> None:
        if self.draining:
            return
        self.draining = True
        asyncio.get_running_loop().call_later(DRAIN_POLL_S, self._drain_poll)

    def _drain_poll(self) -> None:
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            self.draining = False
            return
        if transport.get_write_buffer_size() <= WRITE_LOW_WATER:
            self.draining = False
            self.channel.set_writable(True)
            self.flush()
        else:
            asyncio.get_running_loop().call_later(DRAIN_POLL_S, self._drain_poll)


class PubSub:
    """The pub/sub service of one node."""

    def __init__(
        self,
        *,
        node_id: str,
        config: PubSubSection,
        log_store: MessageLog,
        policy: AccessPolicy,
        retention: RetentionPolicy,
        metrics: MetricsRegistry,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.log = log_store  # the node feeds its commits to on_commit (see node.py)
        self.policy = policy
        self.retention = retention
        self.index: SubscriptionIndex[Subscriber] = SubscriptionIndex()
        self.subscribers: set[Subscriber] = set()
        self.presence = PresenceTable(silence_ms=int(config.presence_silence_s * 1000))
        self.active_consumers: dict[tuple[str, str], Subscriber] = {}
        # The node wires this to the mesh, which gossips local members' presence events.
        self.on_local_presence: Callable[[list[PresenceEvent]], None] = lambda events: None
        self.metrics = PubSubMetrics.register(metrics, lambda: float(len(self.subscribers)))
        self._member_limit = RateLimiter(config.publish_per_s_member)
        self._token_limit = RateLimiter(config.publish_per_s_token)
        self._dirty: list[Subscriber] = []
        self._flush_scheduled = False

    # --- publishing -----------------------------------------------------------------

    def authorize_publish(
        self, caller: Caller, topic: str, data: Any, session: Subscriber | None = None
    ) -> None:
        """The checks of a publish whose topic, type and TTL are valid already (a parsed
        WebSocket frame): payload size, permission, rate limit. A ``session`` remembers its
        permission decisions for its next publishes.

        Raises:
            PayloadTooLarge, Forbidden, RateLimited.
        """
        encoded_payload(data, self.config.max_payload_bytes)
        if session is not None:
            allowed = session.may_publish(topic, self.policy)
        else:
            allowed = self.policy.may_publish(caller, topic)
        if not allowed:
            raise Forbidden(f"publishing to {topic} is not allowed")
        if caller.rate_limited:
            limiter = self._token_limit if caller.token is not None else self._member_limit
            try:
                limiter.check(caller.owner, time.monotonic())
            except RateLimited:
                self.metrics.rate_limited.inc("publish")
                raise

    async def publish(
        self, caller: Caller, topic: object, msg_type: object, data: Any, ttl_s: object = None
    ) -> StoredMessage:
        """Publish as this node on behalf of ``caller``; returns once durable (spec §6.4).

        Raises:
            BadRequest, PayloadTooLarge, Forbidden, RateLimited, Unavailable.
        """
        stored = await self.submit(
            caller, validate_topic(topic), validate_type(msg_type), data, ttl_s=validate_ttl(ttl_s)
        )
        assert stored is not None
        return stored

    def submit(
        self,
        caller: Caller,
        topic: str,
        msg_type: str,
        data: Any,
        *,
        ttl_s: int | None = None,
        session: Subscriber | None = None,
    ) -> asyncio.Future[StoredMessage | None]:
        """The one publish path (HTTP and WebSocket): authorize a publish whose topic, type
        and TTL are valid already and queue it on the log; the future resolves once the
        message is durable, or fails with the publish's own error (spec §6.4).

        Raises:
            PayloadTooLarge, Forbidden, RateLimited, Unavailable (the log's queue is full).
        """
        self.authorize_publish(caller, topic, data, session)
        return self.log.publish(
            topic=topic, msg_type=msg_type, data=data, ttl_s=ttl_s, sender=caller.sender
        )

    # --- fan-out ----------------------------------------------------------------------

    def on_commit(self, batch: list[StoredMessage]) -> None:
        """Called after each commit of the log, in seq order (the node's commit pipeline):
        deliver to subscribers.

        Messages are grouped by topic; each group is encoded once per transport form and
        every matching subscriber takes a slice of the same lists (spec §11: encode once,
        one write per subscriber per loop turn).
        """
        groups: dict[str, list[EncodedMessage]] = {}
        for stored in batch:
            groups.setdefault(stored.message.topic, []).append(EncodedMessage(stored))
        policy = self.policy
        match = self.index.match
        if len(groups) == 1:
            ((topic, items),) = groups.items()
            group = TopicBatch(topic, items)
            for sub in match(topic):
                sub.deliver_batch(group, policy)
                self._delivered(sub)
        else:
            per_sub: dict[Subscriber, list[TopicBatch]] = {}
            for topic, items in groups.items():
                group = TopicBatch(topic, items)
                for sub in match(topic):
                    per_sub.setdefault(sub, []).append(group)
            for sub, sub_groups in per_sub.items():
                if len(sub_groups) == 1:
                    sub.deliver_batch(sub_groups[0], policy)
                else:
                    sub.deliver_merged(sub_groups, policy)  # keep seq order across topics
                self._delivered(sub)
        local = sum(1 for stored in batch if stored.message.origin == self.node_id)
        if local:
            self.metrics.published.inc("local", amount=local)
        if local < len(batch):
            self.metrics.published.inc("remote", amount=len(batch) - local)

    def _delivered(self, sub: Subscriber) -> None:
        """After a batch was offered to ``sub``: flush it this loop turn; a durable
        consumer whose queue overflowed starts reading the rest from the log."""
        if sub.channel.refill:
            self._start_refill(sub)
        self.wake(sub)

    def _flush_dirty(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        sent = 0
        gaps = 0
        for sub in dirty:
            sent += sub.write_out()
            gaps += sub.take_gaps()
        self.count_sent(sent, gaps)

    def count_sent(self, messages: int, gaps: int) -> None:
        """Message and gap frames written to subscribers (spec §9 metrics)."""
        if messages:
            self.metrics.delivered.inc(amount=messages)
        if gaps:
            self.metrics.gaps.inc(amount=gaps)

    def wake(self, sub: Subscriber) -> None:
        """Flush a subscriber soon (after an ack, a control frame, or new backlog)."""
        if not sub.flush_scheduled:
            sub.flush_scheduled = True
            self._dirty.append(sub)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_dirty)

    # --- subscribing ------------------------------------------------------------------

    def register(self, sub: Subscriber) -> None:
        """A new session (before any subscription)."""
        sub.service = self
        self.subscribers.add(sub)

    async def subscribe(
        self,
        sub: Subscriber,
        patterns: tuple[TopicPattern, ...],
        *,
        since: Since | None = None,
        consumer: str | None = None,
        presence: dict[str, Any] | None = None,
        backlog_limit: int | None = None,
    ) -> None:
        """Add patterns to a session, send ``subscribed``, then backlog, then live.

        A session's subscribes run one at a time: a second one waits until the first has
        queued its whole backlog (two catch-ups on one channel would break its ordering).
        ``backlog_limit`` stops the backlog after that many messages (long-poll reads no
        more than it can return); the channel then goes live.

        Raises:
            Forbidden: an access rule denies a pattern.
            BadRequest: ``since``/``consumer`` on a session that already subscribed, too many
                patterns.
        """
        async with sub.subscribing:
            await self._subscribe(
                sub,
                patterns,
                since=since,
                consumer=consumer,
                presence=presence,
                backlog_limit=backlog_limit,
            )

    async def _subscribe(
        self,
        sub: Subscriber,
        patterns: tuple[TopicPattern, ...],
        *,
        since: Since | None,
        consumer: str | None,
        presence: dict[str, Any] | None,
        backlog_limit: int | None,
    ) -> None:
        if sub.closed:
            return
        patterns = tuple({p.text: p for p in patterns}.values())  # each pattern once
        adding = sum(1 for p in patterns if p.text not in sub.patterns)
        if len(sub.patterns) + adding > self.config.max_patterns_per_session:
            raise BadRequest(f"at most {self.config.max_patterns_per_session} patterns per session")
        if (since is not None or consumer is not None) and sub.patterns:
            raise BadRequest(
                "since and consumer are accepted on a session's first subscribe only; "
                "open another session to resume other topics"
            )
        filtered = False
        for pattern in patterns:
            filtered = self.policy.check_subscribe(sub.caller, pattern.text) or filtered
        after = await self._start_point(sub, patterns, since, consumer, filtered=filtered)
        if after is None or sub.closed:
            return  # reset sent (the client resumes by time), or the session ended
        head = self.log.head_seq
        new = [p for p in patterns if p.text not in sub.patterns]
        for pattern in new:
            sub.patterns[pattern.text] = pattern
            self.index.add(pattern, sub)
        sub.filtered = sub.filtered or filtered
        sub.send_control(
            "subscribed",
            {"topics": [p.text for p in patterns], "epoch": self.log.epoch, "head_seq": head},
        )
        joined = [p.text for p in patterns if p.is_literal] if presence is not None else []
        if joined:
            assert presence is not None
            self._join_presence(sub, joined, presence)  # snapshots that include the joiner
        # spec §6.6: a new subscriber gets a snapshot of every present topic it matches
        # (literal topics looked up; only wildcards go through the present topics)
        present = self.presence.topics
        wildcards = [p for p in patterns if not p.is_literal]
        matched = {p.text for p in patterns if p.is_literal and p.text in present}
        if wildcards:
            matched.update(t for t in present if any(p.matches(t) for p in wildcards))
        for topic in sorted(matched):
            if topic not in joined and (
                not sub.filtered or self.policy.may_receive(sub.caller, topic)
            ):
                sub.send_control(
                    "presence",
                    {"topic": topic, "kind": "snapshot", "members": self.presence.members(topic)},
                )
        if consumer is not None and since is None:
            self._report_lost(sub)  # what retention took from the consumer, after `subscribed`
        if after[0] < head:
            await self._catch_up(
                sub, list(patterns), after[0], head, min_ts=after[1], limit=backlog_limit
            )
        elif sub.channel.state is ChannelState.CATCHING_UP:
            sub.channel.finish_catch_up()
        self.wake(sub)

    async def _start_point(
        self,
        sub: Subscriber,
        patterns: tuple[TopicPattern, ...],
        since: Since | None,
        consumer: str | None,
        *,
        filtered: bool,
    ) -> tuple[int, int | None] | None:
        """Where the backlog starts: ``(after_seq, min_ts)``; None after sending ``reset``.
        ``filtered``: some matching topics are hidden from this caller (not counted in
        ``last: N``)."""
        head = self.log.head_seq
        if consumer is not None:
            record = self._take_consumer(sub, consumer, patterns)
            if since is None:
                return (record.cursor, None)
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
                self.wake(sub)
                return None
            return (since.seq, None)
        if since.ts is not None:
            return (0, since.ts)
        assert since.last is not None
        caller, policy = sub.caller, self.policy
        last = await self.log.read_last(
            list(patterns),
            since.last,
            upto_seq=head,
            keep=(lambda topic: policy.may_receive(caller, topic)) if filtered else None,
        )
        return (last[0].seq - 1 if last else head, None)

    def _report_lost(self, sub: Subscriber) -> None:
        """A ``gap`` for what retention removed from a consumer past its bound (spec §6.8)."""
        record = sub.consumer
        if record is not None and record.lost is not None:
            sub.send_control("gap", {"from_seq": record.lost[0], "to_seq": record.lost[1]})
            record.lost = None
            self.log.save_consumer(record)

    def _take_consumer(
        self, sub: Subscriber, name: str, patterns: tuple[TopicPattern, ...]
    ) -> ConsumerRecord:
        owner = sub.caller.owner
        key = (owner, name)
        old = self.active_consumers.get(key)
        if old is not None and old is not sub:
            # spec §6.8: the new connection takes over; the old one is closed with 4409
            self.detach(old)
            if old.on_taken_over is not None:
                old.on_taken_over(CLOSE_TAKEN_OVER, "consumer taken over")
        record = self.log.consumer(owner, name)
        if record is None:
            record = ConsumerRecord(owner, name, tuple(p.text for p in patterns), self.log.head_seq)
        else:
            record.patterns = tuple(p.text for p in patterns)
        self.log.save_consumer(record)
        sub.consumer = record
        sub.channel.lossless = True
        self.active_consumers[key] = sub
        return record

    async def _catch_up(
        self,
        sub: Subscriber,
        patterns: list[TopicPattern],
        after: int,
        head: int,
        *,
        min_ts: int | None,
        limit: int | None,
    ) -> None:
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
            self.metrics.refills.inc()
            cursor, head = max(cursor, head), self.log.head_seq
        if not sub.closed:
            channel.finish_catch_up()
            self.wake(sub)

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
            page = await self.log.read_matching(
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
                self.wake(sub)
                if left is not None:
                    left -= len(page)
            if exhausted:
                break
        return cursor, left

    def _start_refill(self, sub: Subscriber) -> None:
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
                self.metrics.refills.inc()
                self._report_lost(sub)  # what retention removed past the consumer's bound
                await self._catch_up(
                    sub, list(sub.patterns.values()), after, head, min_ts=None, limit=None
                )
        except (WireError, StorageError) as exc:
            log.warning("durable consumer refill stopped: %s", exc)
            if sub.on_taken_over is not None:  # the client reconnects and resumes
                sub.on_taken_over(CLOSE_TRY_AGAIN, "refill failed")
        finally:
            sub.refill_task = None
        if sub.channel.refill:  # overflowed again between the catch-up and now
            self._start_refill(sub)

    def replace_rules(self, rules: tuple[AccessRule, ...]) -> int:
        """New access rules (the community's changed, spec §6.9). Every session's rights
        are checked again: a subscription the new rules refuse is dropped with an
        ``error`` frame (``forbidden``; the session goes on), and what is delivered or may
        be published follows the new rules. Returns how many subscriptions were dropped."""
        if rules == self.policy.rules:
            return 0
        self.policy.rules = rules
        dropped = 0
        for sub in list(self.subscribers):
            refused: list[TopicPattern] = []
            for pattern in sub.patterns.values():
                try:
                    self.policy.check_subscribe(sub.caller, pattern.text)
                except Forbidden:
                    refused.append(pattern)
            if refused:
                self.unsubscribe(sub, tuple(refused))
                names = ", ".join(p.text for p in refused)
                error = Forbidden(f"the community's access rules no longer allow {names}")
                sub.send_control("error", error.to_frame_data())
                self.wake(sub)
                dropped += len(refused)
            sub.reauthorize(sub.caller, self.policy)  # drops what was cached per topic
        return dropped

    def unsubscribe(self, sub: Subscriber, patterns: tuple[TopicPattern, ...]) -> None:
        """Remove patterns from a session."""
        for pattern in patterns:
            if sub.patterns.pop(pattern.text, None) is not None:
                self.index.remove(pattern, sub)
                if pattern.text in sub.presence_topics:
                    sub.presence_topics.discard(pattern.text)
                    self._broadcast_presence(self.presence.leave(sub.client_id, pattern.text))

    def detach(self, sub: Subscriber) -> None:
        """The session ended: drop subscriptions, presence and its consumer claim."""
        if sub.closed:
            return
        sub.closed = True
        sub.notify_room()
        if sub.refill_task is not None:
            sub.refill_task.cancel()
        for pattern in sub.patterns.values():
            self.index.remove(pattern, sub)
        sub.patterns.clear()
        sub.channel.close()
        self.subscribers.discard(sub)
        if sub.presence_topics:
            self._broadcast_presence(self.presence.leave(sub.client_id))
        if sub.consumer is not None:
            key = (sub.consumer.identity, sub.consumer.name)
            if self.active_consumers.get(key) is sub:
                del self.active_consumers[key]

    def ack(self, sub: Subscriber, upto: int) -> int:
        """Apply a client's ack: the window moves, a durable cursor advances."""
        released = sub.channel.ack(upto)
        if released and sub.consumer is not None and upto > sub.consumer.cursor:
            sub.consumer.cursor = min(upto, sub.channel.delivered_seq)
            self.log.save_consumer(sub.consumer)
        if released:
            self.wake(sub)
        return released

    # --- presence -------------------------------------------------------------------

    def _join_presence(self, sub: Subscriber, topics: list[str], fields: dict[str, Any]) -> None:
        """Join: others get a ``join`` event; the joiner gets a snapshot that includes itself."""
        now = now_ms()
        for topic in topics:
            member = Member(
                sub.client_id,
                sub.caller.owner,
                self.node_id,
                now,
                now,
                fields.get("name"),
                fields.get("status"),
                fields.get("meta"),
            )
            events = self.presence.join(topic, member)
            sub.presence_topics.add(topic)
            self._broadcast_presence(events, skip=sub)
            sub.send_control(
                "presence",
                {"topic": topic, "kind": "snapshot", "members": self.presence.members(topic)},
            )

    def update_presence(self, sub: Subscriber, fields: dict[str, Any], topic: str | None) -> None:
        """``presence.update`` from a client."""
        if not sub.presence_topics:
            raise BadRequest("no presence: subscribe with presence first")
        if topic is not None and topic not in sub.presence_topics:
            raise BadRequest(f"no presence on {topic}")
        self._broadcast_presence(self.presence.update(sub.client_id, fields, now_ms(), topic))

    def heard(self, sub: Subscriber) -> None:
        """The client sent a frame or a pong (spec §6.6: silence means leave)."""
        if sub.presence_topics:
            self.presence.touch(sub.client_id, now_ms())

    def expire_presence(self) -> None:
        """Leave events for silent members (run by the sweeper)."""
        events = self.presence.expire(now_ms())
        for event in events:
            for sub in self.subscribers:
                if sub.client_id == event.member["client_id"]:
                    sub.presence_topics.discard(event.topic)
        self._broadcast_presence(events)

    def _broadcast_presence(
        self, events: list[PresenceEvent], skip: Subscriber | None = None, *, local: bool = True
    ) -> None:
        """Deliver presence events to local subscribers; local members' events also go to
        the mesh (``on_local_presence``), which gossips them to other nodes (spec §6.6)."""
        for event in events:
            for sub in self.index.match(event.topic):
                if sub is skip:
                    continue
                if not sub.filtered or self.policy.may_receive(sub.caller, event.topic):
                    sub.send_control("presence", event.to_json())
                    self.wake(sub)
        if local:
            mine = [e for e in events if e.member.get("node") == self.node_id]
            if mine:
                self.on_local_presence(mine)

    def local_presence(self, kind: str) -> list[dict[str, Any]]:
        """Every local member as presence event data (for refreshing peers)."""
        return [
            {"topic": topic, "kind": kind, "member": member.to_json()}
            for topic, members in self.presence.topics.items()
            for member in members.values()
            if member.local
        ]

    def apply_remote_presence(self, event: object) -> None:
        """A presence event gossiped from another node: update the table (remote members
        expire 45 s after their last refresh) and tell local subscribers of changes."""
        if not isinstance(event, dict):
            return
        topic, kind, raw = event.get("topic"), event.get("kind"), event.get("member")
        if (
            not isinstance(topic, str)
            or not isinstance(raw, dict)
            or kind not in ("join", "update", "leave", "refresh")
        ):
            return
        client_id, node = raw.get("client_id"), raw.get("node")
        if not isinstance(client_id, str) or not isinstance(node, str) or node == self.node_id:
            return
        if kind == "leave":
            self._broadcast_presence(self.presence.leave(client_id, topic), local=False)
            return
        try:
            fields = validate_presence_fields(
                {k: raw[k] for k in ("name", "status", "meta") if k in raw}
            )
        except BadRequest:
            return
        now = now_ms()
        known = self.presence.topics.get(topic, {}).get(client_id)
        member = Member(
            client_id,
            str(raw.get("identity", "")),
            node,
            int(raw.get("joined_ms") or now),
            now,
            fields.get("name"),
            fields.get("status"),
            fields.get("meta"),
            local=False,
        )
        unchanged = known is not None and (known.name, known.status, known.meta) == (
            member.name,
            member.status,
            member.meta,
        )
        try:
            events = self.presence.join(topic, member)
        except BadRequest:
            return
        if not unchanged:
            self._broadcast_presence(events, local=False)

    # --- reading --------------------------------------------------------------------

    async def history(
        self,
        caller: Caller,
        topic: object,
        *,
        since_seq: int | None,
        since_ts: int | None,
        before_seq: int | None,
        limit: int,
    ) -> tuple[list[StoredMessage], bool]:
        """A history page (spec §6.5), after the read check."""
        topic = validate_topic(topic)
        self.policy.check_read(caller, topic)
        if not 1 <= limit <= 500:
            raise BadRequest("limit is 1..500")
        return await self.log.history(
            topic, since_seq=since_seq, since_ts=since_ts, before_seq=before_seq, limit=limit
        )

    def members(self, caller: Caller, topic: object) -> list[dict[str, Any]]:
        """Presence members of a topic, after the read check."""
        topic = validate_topic(topic)
        self.policy.check_read(caller, topic)
        return self.presence.members(topic)

    def topics(self, caller: Caller, prefix: str, limit: int) -> list[dict[str, Any]]:
        """Active topics the caller may read, by name."""
        out = []
        for topic in sorted(t for t in self.log.topics if t.startswith(prefix)):
            if not self.policy.may_receive(caller, topic):
                continue
            stats = self.log.topics[topic]
            out.append(
                {
                    "topic": topic,
                    "messages": stats.messages,
                    "head_seq": stats.head_seq,
                    "last_ts": stats.last_ts,
                    "subscribers": len(self.index.match(topic)),
                    "presence": len(self.presence.topics.get(topic, {})),
                }
            )
            if len(out) >= limit:
                break
        return out

    # --- retention --------------------------------------------------------------------

    async def retention_loop(self) -> None:
        """Run retention every ``retention_interval_s`` (owned by the node's task group)."""
        while True:
            await asyncio.sleep(self.config.retention_interval_s)
            try:
                await self.apply_retention()
            except (WireError, StorageError) as exc:  # the next pass tries again
                log.warning("retention failed: %s", exc)

    async def apply_retention(self, now: int | None = None) -> int:
        """One retention pass (spec §6.3, §6.8); returns how many messages were deleted."""
        now = now_ms() if now is None else now
        holds = await self._consumer_holds(now)
        doomed: dict[int, tuple[str, int]] = {}

        def consider(rows: list[tuple[int, str, int]]) -> None:
            for seq, topic, ts in rows:
                doomed[seq] = (topic, ts)

        consider(
            await self.log.candidates("expires_ms IS NOT NULL AND expires_ms <= ?", [now], 10_000)
        )
        default_n, default_age = self.retention.default
        for topic, stats in list(self.log.topics.items()):
            max_n, max_age = self.retention.limits_for(topic)
            if stats.messages > max_n:
                cut = await self.log.nth_newest_seq(topic, max_n)
                if cut is not None:
                    consider(
                        await self.log.candidates("topic = ? AND seq < ?", [topic, cut], 10_000)
                    )
            if (max_n, max_age) != (default_n, default_age):
                consider(
                    await self.log.candidates(
                        "topic = ? AND ts < ?", [topic, now - int(max_age * 1000)], 10_000
                    )
                )
        # Pages by seq: old rows of topics with a longer age rule must not fill the page
        # and hide default-age rows behind them (bounded work per pass).
        after = 0
        for _ in range(AGED_PAGES):
            aged = await self.log.candidates(
                "ts < ? AND seq > ?", [now - int(default_age * 1000), after], AGED_PAGE
            )
            consider([r for r in aged if self.retention.limits_for(r[1])[1] == default_age])
            if len(aged) < AGED_PAGE:
                break
            after = aged[-1][0]
        if self.log.total_bytes > self.retention.max_bytes:
            excess = self.log.total_bytes - self.retention.max_bytes
            oldest = await self.log.candidates("1", [], 10_000)
            freed = 0
            for seq, topic, ts in oldest:
                if freed >= excess:
                    break
                doomed[seq] = (topic, ts)
                freed += self.log.topics[topic].bytes // max(1, self.log.topics[topic].messages)
        delete = []
        for seq, (topic, ts) in sorted(doomed.items()):
            held_by = [
                c
                for c, limit in holds
                if c.cursor < seq <= limit
                and ts >= now - int(self.config.consumer_max_age_s * 1000)
                and any(TopicPattern.parse(p).matches(topic) for p in c.patterns)
            ]
            if held_by:
                continue
            for record, _ in holds:
                if seq > record.cursor and any(
                    TopicPattern.parse(p).matches(topic) for p in record.patterns
                ):
                    lost = record.lost
                    record.lost = (min(lost[0], seq), max(lost[1], seq)) if lost else (seq, seq)
                    self.log.save_consumer(record)
            delete.append(seq)
        return await self.log.delete(delete)

    async def _consumer_holds(self, now: int) -> list[tuple[ConsumerRecord, int]]:
        """Each consumer and the highest seq it holds (its ``consumer_max_held``-th match)."""
        holds = []
        for record in self.log.consumers.values():
            patterns = [TopicPattern.parse(p) for p in record.patterns]
            matches = await self.log.read_matching(
                patterns,
                after_seq=record.cursor,
                upto_seq=self.log.head_seq,
                limit=self.config.consumer_max_held,
            )
            limit = (
                matches[-1].seq
                if len(matches) >= self.config.consumer_max_held
                else self.log.head_seq
            )
            holds.append((record, limit))
        return holds
