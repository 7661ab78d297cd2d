"""Durable consumers (spec §6.8): a named cursor per identity that survives sessions.

One session at a time holds a consumer (a new one takes over; the old one is closed with
4409); its acks move the stored cursor; retention keeps what a consumer has not acked up to
``consumer_max_held`` messages and ``consumer_max_age_s``, and reports what it removed
past that bound as a ``gap`` when the consumer next resumes. The records themselves are
kept by the log (:class:`~hearthnet.pubsub.log.ConsumerRecord`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from hearthnet.errors import CapacityExceeded, NotFound
from hearthnet.pubsub.log import ConsumerRecord, MessageLog
from hearthnet.pubsub.logread import TopicMask, held_span
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.transport.keepalive import CLOSE_TAKEN_OVER, DELETED_REASON, TAKEN_OVER_REASON

ALL = 1 << 62  # a hold's limit when the consumer has fewer than max_held messages
HOLDS_SLICE_S = 0.005  # the event loop's time finding holds between yields


class DurableConsumers:
    """The consumers held by this node's sessions, and their records in the log."""

    def __init__(
        self,
        log_store: MessageLog,
        *,
        max_held: int,
        max_per_identity: int = 100,
        max_total: int = 10_000,
    ) -> None:
        self.log = log_store
        self.max_held = max_held
        self.max_per_identity = max_per_identity
        self.max_total = max_total
        self.active: dict[tuple[str, str], Subscriber] = {}

    def take(
        self,
        sub: Subscriber,
        name: str,
        patterns: tuple[TopicPattern, ...],
        detach: Callable[[Subscriber], None],
        *,
        start: int | None = None,
    ) -> ConsumerRecord:
        """``sub`` holds consumer ``name`` of its caller from now on (created with its
        cursor at ``start``, else at the head, when new); a session holding it before is
        detached and told it was taken over.

        Raises:
            CapacityExceeded: a new consumer would pass ``max_consumers_per_identity`` or
                ``max_consumers`` (nothing is taken over then).
        """
        owner = sub.caller.owner
        key = (owner, name)
        if key not in self.log.consumers:
            self._check_room(owner)
        old = self.active.get(key)
        if old is not None and old is not sub:
            # spec §6.8: the new connection takes over; the old one is closed with 4409
            detach(old)
            if old.on_taken_over is not None:
                old.on_taken_over(CLOSE_TAKEN_OVER, TAKEN_OVER_REASON)
        record = self.log.consumers.get((owner, name))
        if record is None:
            cursor = self.log.head_seq if start is None else min(start, self.log.head_seq)
            record = ConsumerRecord(owner, name, tuple(p.text for p in patterns), cursor)
        else:
            record.patterns = tuple(p.text for p in patterns)
        self.log.save_consumer(record)
        sub.consumer = record
        sub.channel.lossless = True
        self.active[key] = sub
        return record

    def _check_room(self, owner: str) -> None:
        """Room for one more consumer of ``owner`` (a count over the records: a new
        consumer is rare, and the records are bounded by these same limits)."""
        records = self.log.consumers
        if len(records) >= self.max_total:
            raise CapacityExceeded(
                f"this node holds {len(records)} durable consumers (pubsub.max_consumers);"
                " delete unused ones: hearthnet consumer rm NAME --owner OWNER"
            )
        mine = sum(1 for identity, _ in records if identity == owner)
        if mine >= self.max_per_identity:
            raise CapacityExceeded(
                f"{owner} has {mine} durable consumers (pubsub.max_consumers_per_identity);"
                " delete one it no longer uses (DELETE /pubsub/v1/consumers/NAME,"
                " hearthnet consumer rm NAME) or reuse a name"
            )

    def listed(self, owner: str | None) -> list[ConsumerRecord]:
        """The consumers of ``owner`` (every identity's with None), by owner and name."""
        return sorted(
            (r for (identity, _), r in self.log.consumers.items() if owner in (None, identity)),
            key=lambda r: (r.identity, r.name),
        )

    def is_held(self, record: ConsumerRecord) -> bool:
        """A session holds ``record`` now."""
        return (record.identity, record.name) in self.active

    async def delete(
        self, owner: str, name: str, detach: Callable[[Subscriber], None]
    ) -> ConsumerRecord:
        """Forget consumer ``name`` of ``owner``: its cursor, and the messages retention
        kept for it. A session holding it is detached and closed as on a take-over (4409).

        Raises:
            NotFound: ``owner`` has no consumer ``name``.
        """
        key = (owner, name)
        record = self.log.consumers.get(key)
        if record is None:
            raise NotFound(f"{owner} has no durable consumer {name!r}")
        holder = self.active.pop(key, None)
        if holder is not None:
            detach(holder)
            holder.consumer = None
            if holder.on_taken_over is not None:
                holder.on_taken_over(CLOSE_TAKEN_OVER, DELETED_REASON)
        record.deleted = True
        self.log.save_consumer(record)
        await self.log.flush_consumers()
        return record

    def report_lost(self, sub: Subscriber) -> None:
        """A ``gap`` for what retention removed from a consumer past its bound (spec §6.8)."""
        record = sub.consumer
        if record is not None and record.lost is not None:
            sub.send_control("gap", {"from_seq": record.lost[0], "to_seq": record.lost[1]})
            record.lost = None
            self.log.save_consumer(record)

    def acked(self, sub: Subscriber, upto: int) -> None:
        """An ack that released frames: the cursor follows (never past what was sent)."""
        record = sub.consumer
        if record is not None and upto > record.cursor:
            record.cursor = min(upto, sub.channel.delivered_seq)
            self.log.save_consumer(record)

    def release(self, sub: Subscriber) -> None:
        """The session ended: its consumer is free (the record stays)."""
        if sub.consumer is not None:
            key = (sub.consumer.identity, sub.consumer.name)
            if self.active.get(key) is sub:
                del self.active[key]

    async def holds(self) -> list[Hold]:
        """Each consumer, the first message it may hold (its first match after its
        cursor) and the last (its ``max_held``-th match, expired or not; :data:`ALL` when
        it has fewer, so that what commits meanwhile is held too). Found by position in
        the topics' indexes (:func:`~hearthnet.pubsub.logread.held_span`), or, where the
        log has too many topics to list a wildcard's, by a scan of the seq columns at C
        speed; each set of patterns matched against the topics once, yielding to the
        event loop every :data:`HOLDS_SLICE_S`."""
        log = self.log
        reader, head = log.reader, log.head_seq
        lists: dict[tuple[str, ...], list[Sequence[int]] | TopicMask] = {}
        cols = log.index.cols
        holds = []
        since = time.monotonic()
        for record in list(log.consumers.values()):
            if time.monotonic() - since > HOLDS_SLICE_S:
                await asyncio.sleep(0)
                since = time.monotonic()
            found = lists.get(record.patterns)
            patterns = [TopicPattern.parse(p) for p in record.patterns]
            if found is None:
                found = reader.topic_lists(patterns)
                if found is None:  # too many topics to search: the columns, by topic number
                    found = reader.topic_mask(patterns)
                lists[record.patterns] = found
            if isinstance(found, list):
                first, limit = held_span(found, record.cursor, head, self.max_held)
            else:
                found = lists[record.patterns] = reader.topic_mask(patterns, found)
                first, limit = cols.span(found.bits, record.cursor, head, self.max_held)
            holds.append(
                Hold(record, head + 1 if first is None else first, ALL if limit is None else limit)
            )
        return holds

    def lose(self, record: ConsumerRecord, first: int, last: int) -> None:
        """Retention deleted messages from ``first`` to ``last`` that ``record`` had not
        acked: it learns of the loss (one range) on its next resume. What it acked since
        its holds were found is not lost, and a consumer deleted meanwhile loses nothing."""
        first = max(first, record.cursor + 1)
        if first > last or record.deleted:
            return
        lost = record.lost
        record.lost = (min(lost[0], first), max(lost[1], last)) if lost else (first, last)
        self.log.save_consumer(record)


class Hold(NamedTuple):
    """What a durable consumer keeps from retention: its matches in ``(cursor, limit]``
    (younger than ``consumer_max_age_s``); none below ``first``."""

    record: ConsumerRecord
    first: int
    limit: int
