"""Retention passes over the log (spec §6.3, §6.8): what the rules of
:class:`~hearthnet.pubsub.retention.RetentionPolicy` let go, minus what durable consumers
still hold, deleted every ``retention_interval_s``.

The message cap (``pubsub.max_messages``) also starts a pass at once when a commit takes
the log :data:`OVER_CAP` of the cap past it (or past what durable consumers held after the
last pass), and passes follow one another while each deletes something and the log is
still over the cap: the log (and its indexes in memory) stays within 1.1× the cap, plus
one commit (at most ``max_batch`` messages) and what arrives while a pass runs, as long
as deletes outpace publishes (docs/pubsub.md "Retention" has the measured rates).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from hearthnet.clock import now_ms
from hearthnet.config import PubSubSection
from hearthnet.errors import StorageError, WireError
from hearthnet.pubsub.consumers import DurableConsumers
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.topics import TopicPattern

log = logging.getLogger("hearthnet.pubsub")

AGED_PAGE = 10_000  # retention candidates read at once
AGED_PAGES = 10  # pages of old messages looked at per retention pass
OVER_CAP = 0.1  # share of pubsub.max_messages past it at which a commit starts a pass
CAP_PAGE = 50_000  # messages over pubsub.max_messages deleted per pass (then another pass)


class RetentionPass:
    """Deletes what retention lets go (owned by the node's task group through :meth:`loop`)."""

    def __init__(
        self,
        *,
        config: PubSubSection,
        log_store: MessageLog,
        retention: RetentionPolicy,
        consumers: DurableConsumers,
    ) -> None:
        self.config = config
        self.log = log_store
        self.retention = retention
        self.consumers = consumers
        self.over_cap = asyncio.Event()  # set by on_commit: start a pass now
        self.start_at = self._start_at()

    def _start_at(self) -> int:
        """How many messages held make a commit start a pass: :data:`OVER_CAP` of the cap
        past the cap, or past what the last pass left (durable consumers may hold more
        than the cap: no pass after every commit then)."""
        cap = self.retention.max_log_messages
        return max(cap, len(self.log.index)) + max(1, int(cap * OVER_CAP))

    def on_commit(self, _batch: object) -> None:
        """A commit listener: start a pass when the log holds :attr:`start_at` messages."""
        if len(self.log.index) >= self.start_at:
            self.over_cap.set()

    async def loop(self) -> None:
        """Run retention every ``retention_interval_s``, and at once when the log is
        far over its message cap."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.over_cap.wait(), self.config.retention_interval_s)
            self.over_cap.clear()
            try:
                deleted = await self.apply()
            except (WireError, StorageError) as exc:  # the next pass tries again
                log.warning("retention failed: %s", exc)
                continue
            if deleted and len(self.log.index) > self.retention.max_log_messages:
                self.over_cap.set()  # more than CAP_PAGE over: go on at once

    async def apply(self, now: int | None = None) -> int:
        """One retention pass (spec §6.3, §6.8); returns how many messages were deleted."""
        now = now_ms() if now is None else now
        holds = await self.consumers.holds()
        doomed = await self._doomed(now)
        delete = []
        oldest_held = now - int(self.config.consumer_max_age_s * 1000)
        for seq, (topic, ts) in sorted(doomed.items()):
            held_by = [
                c
                for c, limit in holds
                if c.cursor < seq <= limit
                and ts >= oldest_held
                and any(TopicPattern.parse(p).matches(topic) for p in c.patterns)
            ]
            if held_by:
                continue
            self.consumers.mark_lost(holds, seq, topic)
            delete.append(seq)
        deleted = await self.log.delete(delete)
        self.start_at = self._start_at()
        return deleted

    async def _doomed(self, now: int) -> dict[int, tuple[str, int]]:
        """Every message the rules let go, as ``seq -> (topic, ts)`` (bounded per pass)."""
        log_store, reader = self.log, self.log.reader
        doomed: dict[int, tuple[str, int]] = {}

        def consider(rows: list[tuple[int, str, int]]) -> None:
            for seq, topic, ts in rows:
                doomed[seq] = (topic, ts)

        consider(await reader.candidates(expired_at=now, limit=10_000))
        default_n, default_age = self.retention.default
        for topic, stats in list(log_store.topics.items()):
            max_n, max_age = self.retention.limits_for(topic)
            if stats.messages > max_n:
                cut = await reader.nth_newest_seq(topic, max_n)
                if cut is not None:
                    consider(await reader.candidates(topic=topic, before_seq=cut, limit=10_000))
            if (max_n, max_age) != (default_n, default_age):
                consider(
                    await reader.candidates(
                        topic=topic, ts_below=now - int(max_age * 1000), limit=10_000
                    )
                )
        # Pages by seq: old rows of topics with a longer age rule must not fill the page
        # and hide default-age rows behind them (bounded work per pass).
        after = 0
        for _ in range(AGED_PAGES):
            aged = await reader.candidates(
                ts_below=now - int(default_age * 1000), after_seq=after, limit=AGED_PAGE
            )
            consider([r for r in aged if self.retention.limits_for(r[1])[1] == default_age])
            if len(aged) < AGED_PAGE:
                break
            after = aged[-1][0]
        # The whole log's caps, oldest first: at most 10,000 messages a pass for bytes,
        # CAP_PAGE for the message cap.
        over_bytes = log_store.total_bytes - self.retention.max_bytes
        over_count = min(CAP_PAGE, len(log_store.index) - self.retention.max_log_messages)
        if over_bytes > 0 or over_count > 0:
            oldest = await reader.candidates(limit=max(10_000, over_count))
            freed = taken = 0
            for seq, topic, ts in oldest:
                if freed >= over_bytes and taken >= over_count:
                    break
                doomed[seq] = (topic, ts)
                taken += 1
                freed += log_store.topics[topic].bytes // max(1, log_store.topics[topic].messages)
            log.info(
                "retention: the log holds %d messages (pubsub.max_messages %d) and %d bytes"
                " (pubsub.max_bytes %d); the oldest %d go, unless a durable consumer holds them",
                len(log_store.index),
                self.retention.max_log_messages,
                log_store.total_bytes,
                self.retention.max_bytes,
                taken,
            )
        return doomed
