"""Durable consumers (spec §6.8): a named cursor per identity that survives sessions.

One session at a time holds a consumer (a new one takes over; the old one is closed with
4409); its acks move the stored cursor; retention keeps what a consumer has not acked up to
``consumer_max_held`` messages and ``consumer_max_age_s``, and reports what it removed
past that bound as a ``gap`` when the consumer next resumes. The records themselves are
kept by the log (:class:`~hearthnet.pubsub.log.ConsumerRecord`).
"""

from __future__ import annotations

from collections.abc import Callable

from hearthnet.pubsub.log import ConsumerRecord, MessageLog
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.transport.keepalive import CLOSE_TAKEN_OVER


class DurableConsumers:
    """The consumers held by this node's sessions, and their records in the log."""

    def __init__(self, log_store: MessageLog, *, max_held: int) -> None:
        self.log = log_store
        self.max_held = max_held
        self.active: dict[tuple[str, str], Subscriber] = {}

    def take(
        self,
        sub: Subscriber,
        name: str,
        patterns: tuple[TopicPattern, ...],
        detach: Callable[[Subscriber], None],
    ) -> ConsumerRecord:
        """``sub`` holds consumer ``name`` of its caller from now on (created at the head
        when new); a session holding it before is detached and told it was taken over."""
        owner = sub.caller.owner
        key = (owner, name)
        old = self.active.get(key)
        if old is not None and old is not sub:
            # spec §6.8: the new connection takes over; the old one is closed with 4409
            detach(old)
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
        self.active[key] = sub
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

    async def holds(self) -> list[tuple[ConsumerRecord, int]]:
        """Each consumer and the highest seq it holds (its ``max_held``-th match)."""
        log = self.log
        holds = []
        for record in log.consumers.values():
            patterns = [TopicPattern.parse(p) for p in record.patterns]
            matches = await log.read_matching(
                patterns, after_seq=record.cursor, upto_seq=log.head_seq, limit=self.max_held
            )
            limit = matches[-1].seq if len(matches) >= self.max_held else log.head_seq
            holds.append((record, limit))
        return holds

    def mark_lost(self, holds: list[tuple[ConsumerRecord, int]], seq: int, topic: str) -> None:
        """Retention deletes ``seq`` of ``topic``: every consumer that had not acked it
        learns of the loss on its next resume."""
        for record, _ in holds:
            if seq > record.cursor and any(
                TopicPattern.parse(p).matches(topic) for p in record.patterns
            ):
                lost = record.lost
                record.lost = (min(lost[0], seq), max(lost[1], seq)) if lost else (seq, seq)
                self.log.save_consumer(record)
