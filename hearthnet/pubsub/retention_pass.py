"""Retention passes over the log (spec §6.3, §6.8): what the rules of
:class:`~hearthnet.pubsub.retention.RetentionPolicy` let go, minus what durable consumers
still hold, deleted every ``retention_interval_s``. A pass plans from the indexes
(:mod:`hearthnet.pubsub.retention_plan`: the oldest messages as one prefix, the rest one
by one), checks what is above the prefix against each durable consumer, and hands the
deletes to the log (:mod:`hearthnet.pubsub.logprune`).

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
import time

from hearthnet.clock import now_ms
from hearthnet.config import PubSubSection
from hearthnet.errors import StorageError, WireError
from hearthnet.pubsub.consumers import DurableConsumers, Hold
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.retention_plan import NOTHING_HELD, Above, plan, unheld

log = logging.getLogger("hearthnet.pubsub")

OVER_CAP = 0.1  # share of pubsub.max_messages past it at which a commit starts a pass


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
        self.more = False  # the last pass reached a bound: more would go
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
        far over its message cap; a pass started early looks for old and expired
        messages only when the last look is ``retention_interval_s`` old (those scans
        go over every message held)."""
        interval = self.config.retention_interval_s
        scanned = -interval
        while True:
            # asyncio.timeout, not wait_for: no inner task, so a cancel (the node
            # stopping) always ends the wait (wait_for around Event.wait() was seen to
            # hang, the loop cancelling forever).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.over_cap.wait()
            self.over_cap.clear()
            scan = time.monotonic() - scanned >= interval
            if scan:
                scanned = time.monotonic()
            try:
                deleted = await self.apply(scan=scan)
            except (WireError, StorageError) as exc:  # the next pass tries again
                log.warning("retention failed: %s", exc)
                continue
            if deleted and (self.more or len(self.log.index) > self.retention.max_log_messages):
                self.over_cap.set()  # a pass's bounds were reached: go on at once

    async def apply(self, now: int | None = None, *, scan: bool = True) -> int:
        """One retention pass (spec §6.3, §6.8); returns how many messages were deleted.
        Without ``scan``, only counts and caps (no look for old or expired messages)."""
        now = now_ms() if now is None else now
        log_store = self.log
        holds = await self.consumers.holds()
        todo = plan(
            log_store.index,
            log_store.topics,
            self.retention,
            now=now,
            total_bytes=log_store.total_bytes,
            keep_from=min((h.first for h in holds), default=NOTHING_HELD),
            scan=scan,
        )
        if todo.over_caps:
            log.info(
                "retention: the log holds %d messages (pubsub.max_messages %d) and %d bytes"
                " (pubsub.max_bytes %d); the oldest %d go, unless a durable consumer holds them",
                len(log_store.index),
                self.retention.max_log_messages,
                log_store.total_bytes,
                self.retention.max_bytes,
                todo.over_caps,
            )
        delete = self._unheld(todo.above, holds, now) if holds else [a[0] for a in todo.above]
        deleted = await log_store.delete(delete, before_seq=todo.before_seq)
        self.more = todo.more
        self.start_at = self._start_at()
        return deleted

    def _unheld(self, above: list[Above], holds: list[Hold], now: int) -> list[int]:
        """The seqs of ``above`` no durable consumer holds; each consumer that had not
        acked some of them learns of the loss (spec §6.8)."""
        oldest_held = now - int(self.config.consumer_max_age_s * 1000)
        delete, lost = unheld(
            above, [(h.record.cursor, h.limit, h.record.patterns) for h in holds], oldest_held, now
        )
        for i, (first, last) in lost.items():
            self.consumers.lose(holds[i].record, first, last)
        return delete
