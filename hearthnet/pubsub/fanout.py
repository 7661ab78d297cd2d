"""Fan-out: committed batches to this node's subscribers (spec §6.4, §11).

Designed rather than hoped for: :meth:`FanOut.on_commit` runs once per committed batch
(the node's commit pipeline, ``node.py``); each message is encoded once per transport form
(:class:`~hearthnet.pubsub.wire.EncodedMessage`), every matching subscriber's channel gets
the same bytes, and each subscriber's frames of a commit (with the answers to its own
publishes) leave in one write, in the commit's loop turn; frames made between commits
(acks letting queued frames out, control frames) leave once per loop turn. A batch that
many subscribers take whole is one bytes object, sent to each socket from one memory file
(:class:`~hearthnet.transport.direct.SharedBytes`) for the commit's flush.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from hearthnet.metrics import Counter, MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.batchsig import VERIFIER
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.index import SubscriptionIndex
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.wire import EncodedMessage, TopicBatch
from hearthnet.transport.direct import SharedBytes

# A commit's joined batch is sent from a memory file when at least this many subscribers
# match its topic: the file costs ~40 µs to make and a send from it saves ~0.5-2.5 µs of
# CPU per socket at ~54 KB over loopback (SharedBytes makes it at the 4th socket).
SHARE_MIN_SUBSCRIBERS = 32


@dataclass(slots=True)
class PubSubMetrics:
    """Pub/sub series in ``/metrics`` (spec §9)."""

    published: Counter
    delivered: Counter
    gaps: Counter
    duplicates: Counter
    deferred: Counter
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
            deferred=registry.counter(
                "hearthnet_gossip_deferred_total",
                "Gossiped messages not taken while the log's queue was full "
                "(anti-entropy asks for them again).",
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


class FanOut:
    """Delivers committed batches and flushes subscribers once per loop turn."""

    def __init__(
        self,
        *,
        node_id: str,
        index: SubscriptionIndex[Subscriber],
        policy: AccessPolicy,
        metrics: PubSubMetrics,
        refill: Callable[[Subscriber], None],
    ) -> None:
        self.node_id = node_id
        self.index = index
        self.policy = policy
        self.metrics = metrics
        self._refill = refill  # a durable consumer's queue overflowed (catch-up reads the log)
        self._dirty: list[Subscriber] = []
        self._flush_scheduled = False
        self._shared = SharedBytes()  # this commit's joined batches, for its flush

    def on_commit(self, batch: list[StoredMessage]) -> None:
        """Called after each commit of the log, in seq order (the node's commit pipeline):
        deliver to subscribers.

        Messages are grouped by topic; each group is encoded once per transport form and
        every matching subscriber takes a slice of the same lists (spec §11: encode once,
        one write per subscriber per loop turn).
        """
        groups: dict[str, list[EncodedMessage]] = {}
        for stored in batch:
            groups.setdefault(stored.topic, []).append(EncodedMessage(stored))
        policy = self.policy
        match = self.index.match
        if len(groups) == 1:
            ((topic, items),) = groups.items()
            group = TopicBatch(topic, items)
            dirty = self._dirty
            subs = match(topic)
            for sub in subs:  # every subscriber of every batch: calls kept few
                sub.deliver_batch(group, policy)
                if sub.channel.refill:
                    self._refill(sub)
                if not sub.flush_scheduled:  # self.wake(sub), inline
                    sub.flush_scheduled = True
                    dirty.append(sub)
            if len(subs) >= SHARE_MIN_SUBSCRIBERS:
                self._share(group)
        else:
            per_sub: dict[Subscriber, list[TopicBatch]] = {}
            shared: list[TopicBatch] = []
            for topic, items in groups.items():
                group = TopicBatch(topic, items)
                subs = match(topic)
                if len(subs) >= SHARE_MIN_SUBSCRIBERS:
                    shared.append(group)
                for sub in subs:
                    per_sub.setdefault(sub, []).append(group)
            for sub, sub_groups in per_sub.items():
                if len(sub_groups) == 1:
                    sub.deliver_batch(sub_groups[0], policy)
                else:
                    sub.deliver_merged(sub_groups, policy)  # keep seq order across topics
                self._delivered(sub)
            for group in shared:
                self._share(group)
        local = sum(1 for stored in batch if stored.origin == self.node_id)
        if local:
            self.metrics.published.inc("local", amount=local)
        if local < len(batch):
            self.metrics.published.inc("remote", amount=len(batch) - local)
        if self._dirty:
            # Written in the commit's loop turn, not the next one: a loop turn later is
            # a turn of every other session's reads later (the publishers' answers,
            # queued by the log before this call, leave in the same writes).
            self._flush_dirty()

    def _share(self, group: TopicBatch) -> None:
        """``group``'s joined batches go to many subscribers in this commit's flush."""
        for whole in group.joined_forms():
            self._shared.offer(whole)

    def _delivered(self, sub: Subscriber) -> None:
        """After a batch was offered to ``sub``: flush it this loop turn; a durable
        consumer whose queue overflowed starts reading the rest from the log."""
        if sub.channel.refill:
            self._refill(sub)
        self.wake(sub)

    def wake(self, sub: Subscriber) -> None:
        """Flush a subscriber soon (after an ack, a control frame, or new backlog)."""
        if not sub.flush_scheduled:
            sub.flush_scheduled = True
            self._dirty.append(sub)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        sent = 0
        gaps = 0
        now = time.monotonic()
        shared = self._shared if self._shared else None
        try:
            for sub in dirty:
                sent += sub.write_out(now, shared)
                if sub.channel.gaps_total != sub.gaps_reported:
                    gaps += sub.take_gaps()
        finally:
            if shared is not None:
                shared.close()  # a batch a channel still holds is written plainly later
        self.count_sent(sent, gaps)

    def count_sent(self, messages: int, gaps: int) -> None:
        """Message and gap frames written to subscribers (spec §9 metrics)."""
        if messages:
            self.metrics.delivered.inc(amount=messages)
        if gaps:
            self.metrics.gaps.inc(amount=gaps)
