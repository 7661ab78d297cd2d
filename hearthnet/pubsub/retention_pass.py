"""Retention passes over the log (spec §6.3, §6.8): what the rules of
:class:`~hearthnet.pubsub.retention.RetentionPolicy` let go, minus what durable consumers
still hold, deleted every ``retention_interval_s``.
"""

from __future__ import annotations

import asyncio
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

    async def loop(self) -> None:
        """Run retention every ``retention_interval_s``."""
        while True:
            await asyncio.sleep(self.config.retention_interval_s)
            try:
                await self.apply()
            except (WireError, StorageError) as exc:  # the next pass tries again
                log.warning("retention failed: %s", exc)

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
        return await self.log.delete(delete)

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
        if log_store.total_bytes > self.retention.max_bytes:
            excess = log_store.total_bytes - self.retention.max_bytes
            oldest = await reader.candidates(limit=10_000)
            freed = 0
            for seq, topic, ts in oldest:
                if freed >= excess:
                    break
                doomed[seq] = (topic, ts)
                freed += log_store.topics[topic].bytes // max(1, log_store.topics[topic].messages)
        return doomed
