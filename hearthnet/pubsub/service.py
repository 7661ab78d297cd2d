"""Pub/sub on one node (spec §6): the one facade that HTTP, WebSocket, the node's own
services and peers use: publish (:meth:`PubSub.publish`, a WebSocket session's group
:meth:`PubSub.submit_many`), peers' and federated messages (:meth:`PubSub.ingest`),
subscribe, ack, presence, history, retention.

The work is done by the parts it wires together: the log (numbering, dedupe and topic
stats, then durable storage: :mod:`hearthnet.pubsub.log`), fan-out
(:mod:`hearthnet.pubsub.fanout`), catch-up (:mod:`hearthnet.pubsub.catchup`), durable
consumers (:mod:`hearthnet.pubsub.consumers`), presence
(:mod:`hearthnet.pubsub.presence_hub`) and retention
(:mod:`hearthnet.pubsub.retention_pass`). Subscribers
(:mod:`hearthnet.pubsub.subscriber`) write through the sinks of the I/O layer
(:mod:`hearthnet.pubsub.sinks`). The node's commit pipeline (``node.py``) hands each
committed batch to :meth:`FanOut.on_commit <hearthnet.pubsub.fanout.FanOut.on_commit>`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from hearthnet.caller import Caller
from hearthnet.config import PubSubSection
from hearthnet.errors import BadRequest, Forbidden, RateLimited
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy, AccessRule
from hearthnet.pubsub.catchup import CatchUp
from hearthnet.pubsub.channel import ChannelState
from hearthnet.pubsub.consumers import DurableConsumers
from hearthnet.pubsub.envelope import Message, StoredMessage, validate_ttl, validate_type
from hearthnet.pubsub.envelope_fields import check_payload
from hearthnet.pubsub.fanout import FanOut, PubSubMetrics
from hearthnet.pubsub.frames import Since
from hearthnet.pubsub.idempotency import PublishKeys, Receipt, refusal, validate_key
from hearthnet.pubsub.index import SubscriptionIndex
from hearthnet.pubsub.log import MessageLog, PublishItem
from hearthnet.pubsub.logcommit import Answer, Outcome
from hearthnet.pubsub.presence import PresenceTable
from hearthnet.pubsub.presence_hub import PresenceHub
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.retention_pass import RetentionPass
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.topics import TopicPattern, validate_topic
from hearthnet.ratelimit import RateLimiter


async def publish_once(
    service: PubSub,
    caller: Caller,
    topic: object,
    msg_type: object,
    data: Any,
    *,
    ttl_s: object,
    key: object,
) -> Receipt:
    """:meth:`PubSub.publish` with an idempotency ``key``
    (:mod:`hearthnet.pubsub.idempotency`): the same checks, then the publish is queued
    unless the caller's key is known or in flight, in which case the answer is the first
    publish's receipt (``duplicate`` true) or refusal. The key is settled from the log's
    answer, not from this coroutine: a caller that goes away (an HTTP client that dropped
    its connection, its handler cancelled) still leaves the receipt for its retry.

    Raises:
        BadRequest (the key too), PayloadTooLarge, Forbidden, RateLimited, Unavailable
            (the log's queue is full: the key is forgotten); or the first's refusal, for
            a duplicate that waited for it.
    """
    key = validate_key(key)
    topic, msg_type = validate_topic(topic), validate_type(msg_type)
    ttl = validate_ttl(ttl_s)
    service.authorize_publish(caller, topic, data)
    keys, owner = service.keys, caller.owner
    claimed = keys.claim(owner, key, time.monotonic())
    if isinstance(claimed, Receipt):
        return claimed
    fut: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()

    def reply(outcome: Receipt | Exception) -> None:
        if fut.done():
            return  # the caller went away
        if isinstance(outcome, Exception):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    if claimed is not None:  # the first is in flight: its answer is this one's
        claimed.append(reply)
        return await fut

    def answer(outcomes: list[Outcome]) -> None:
        outcome = outcomes[0]
        keys.settle(owner, key, outcome, time.monotonic())
        reply(Receipt.of(outcome) if isinstance(outcome, StoredMessage) else refusal(outcome))

    try:
        service.log.publish_many(((topic, msg_type, data, ttl, caller.sender),), answer=answer)
    except Exception as exc:
        keys.settle(owner, key, exc, time.monotonic())
        raise
    return await fut


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
        self.log = log_store  # the node feeds its commits to fanout.on_commit (node.py)
        self.policy = policy
        self.retention = retention
        self.index: SubscriptionIndex[Subscriber] = SubscriptionIndex()
        self.subscribers: set[Subscriber] = set()
        self.presence = PresenceTable(silence_ms=int(config.presence_silence_s * 1000))
        self.metrics = PubSubMetrics.register(metrics, lambda: float(len(self.subscribers)))
        self.consumers = DurableConsumers(
            log_store,
            max_held=config.consumer_max_held,
            max_per_identity=config.max_consumers_per_identity,
            max_total=config.max_consumers,
        )
        self.catch_up = CatchUp(
            log_store=log_store,
            policy=policy,
            consumers=self.consumers,
            refills=self.metrics.refills,
            detach=self.detach,
        )
        self.fanout = FanOut(
            node_id=node_id,
            index=self.index,
            policy=policy,
            metrics=self.metrics,
            refill=self.catch_up.start_refill,
        )
        # The node wires presence_hub.on_local to the mesh, which gossips local members.
        self.presence_hub = PresenceHub(
            node_id=node_id,
            table=self.presence,
            index=self.index,
            policy=policy,
            subscribers=self.subscribers,
        )
        self.retention_pass = RetentionPass(
            config=config, log_store=log_store, retention=retention, consumers=self.consumers
        )
        self.keys = PublishKeys(
            window_s=config.idempotency_window_s, max_keys=config.idempotency_max_keys
        )
        self._member_limit = RateLimiter(config.publish_per_s_member)
        self._token_limit = RateLimiter(config.publish_per_s_token)

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
        check_payload(data, self.config.max_payload_bytes)
        if session is not None:
            allowed = session.may_publish(topic, self.policy)
        else:
            allowed = self.policy.may_publish(caller, topic)
        if not allowed:
            reason = self.policy.refusal(caller, "publish", topic)
            raise Forbidden(f"publishing to {topic} is not allowed: {reason}")
        if caller.rate_limited:
            limiter = self._token_limit if caller.token is not None else self._member_limit
            try:
                limiter.check(caller.owner, time.monotonic())
            except RateLimited as exc:
                self.metrics.rate_limited.inc("publish")
                who, key = ("token client", "token") if caller.token else ("member", "member")
                raise RateLimited(
                    f"over the publish rate limit of a {who}, {limiter.rate:g} messages/s"
                    f" (publish_per_s_{key})",
                    retry_after_ms=exc.retry_after_ms,
                ) from exc

    async def publish(
        self, caller: Caller, topic: object, msg_type: object, data: Any, ttl_s: object = None
    ) -> StoredMessage:
        """The one publish path of a lone publish (HTTP, the node's own services): check
        the fields, authorize (:meth:`authorize_publish`), queue it on the log; returns
        once the message is durable (spec §6.4). One with an idempotency key goes
        through :func:`publish_once`.

        Raises:
            BadRequest, PayloadTooLarge, Forbidden, RateLimited, Unavailable (the log's
            queue is full).
        """
        topic, msg_type = validate_topic(topic), validate_type(msg_type)
        ttl = validate_ttl(ttl_s)
        self.authorize_publish(caller, topic, data)
        stored = await self.log.publish(
            topic=topic, msg_type=msg_type, data=data, ttl_s=ttl, sender=caller.sender
        )
        assert stored is not None  # a new publish is never a duplicate
        return stored

    def submit_many(self, items: Sequence[PublishItem], *, answer: Answer) -> None:
        """Queue publishes that passed :meth:`authorize_publish` each (a WebSocket
        session's of one loop turn) as one group: ``answer`` gets every outcome, in
        order, in the loop turn of the commit (see :meth:`MessageLog.publish_many`).

        Raises:
            Unavailable: the log's queue cannot take them all (none is queued).
        """
        self.log.publish_many(items, answer=answer)

    def ingest(self, message: Message, source: str | None) -> asyncio.Future[StoredMessage | None]:
        """The path of a verified message from another node (gossip from ``source``, or
        a federated community's, ``source`` None): queued on the log like a publish; the
        future resolves once it is durable, to None when the log held it already.

        Raises:
            Unavailable: the log's queue is full (nothing is queued: gossip's
                anti-entropy asks for it again, a federation pull keeps its cursor).
        """
        return self.log.ingest(message, source)

    # --- subscribing ------------------------------------------------------------------

    def register(self, sub: Subscriber) -> None:
        """A new session (before any subscription)."""
        sub.fanout = self.fanout
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
        after = await self.catch_up.start_point(sub, patterns, since, consumer, filtered=filtered)
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
            self.presence_hub.join(sub, joined, presence)  # snapshots that include the joiner
        self.presence_hub.snapshots(sub, patterns, joined)
        if consumer is not None and since is None:
            self.consumers.report_lost(sub)  # what retention took, after `subscribed`
        if after[0] < head:
            await self.catch_up.run(
                sub, list(patterns), after[0], head, min_ts=after[1], limit=backlog_limit
            )
        elif sub.channel.state is ChannelState.CATCHING_UP:
            sub.channel.finish_catch_up()
        sub.wake()

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
                sub.wake()
                dropped += len(refused)
            sub.reauthorize(sub.caller, self.policy)  # drops what was cached per topic
        return dropped

    def unsubscribe(self, sub: Subscriber, patterns: tuple[TopicPattern, ...]) -> None:
        """Remove patterns from a session."""
        for pattern in patterns:
            if sub.patterns.pop(pattern.text, None) is not None:
                self.index.remove(pattern, sub)
                self.presence_hub.leave(sub, pattern.text)

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
        self.presence_hub.leave(sub)
        self.consumers.release(sub)

    def ack(self, sub: Subscriber, upto: int) -> int:
        """Apply a client's ack: the window moves, a durable cursor advances, and the
        subscriber is flushed only when the ack let frames out or a catch-up waits for
        room (most acks at 1→1,000 release nothing that waits)."""
        channel = sub.channel
        released = channel.ack(upto)
        if released:
            self.consumers.acked(sub, upto)
            if channel.out or channel.state is ChannelState.CATCHING_UP:
                sub.wake()
        return released

    # --- presence -------------------------------------------------------------------

    def update_presence(self, sub: Subscriber, fields: dict[str, Any], topic: str | None) -> None:
        """``presence.update`` from a client."""
        self.presence_hub.update(sub, fields, topic)

    def heard(self, sub: Subscriber) -> None:
        """The client sent a frame or a pong (spec §6.6: silence means leave)."""
        self.presence_hub.heard(sub)

    def local_presence(self, kind: str) -> list[dict[str, Any]]:
        """Every local member as presence event data (for refreshing peers)."""
        return self.presence_hub.local_events(kind)

    def apply_remote_presence(self, event: object) -> None:
        """A presence event gossiped from another node (see :meth:`PresenceHub.apply_remote`)."""
        self.presence_hub.apply_remote(event)

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
        return await self.log.reader.history(
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

    async def apply_retention(self, now: int | None = None) -> int:
        """One retention pass (spec §6.3, §6.8); returns how many messages were deleted."""
        return await self.retention_pass.apply(now)
