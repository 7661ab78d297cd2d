"""The node's message log in SQLite (spec §6.3, §6.4): group commit, seq, epoch, dedupe.

One writer and one reader connection (WAL lets reads run beside the writer). A local
publish is numbered (``origin_seq``) when it is queued; the flush loop takes everything
queued and hands the batch to the writer thread as **one job**: sign the local publishes,
drop peers' duplicates, assign ``seq``, insert, commit. One hand-over per batch matters:
each trip between the event loop and a worker thread waits for the GIL, and a busy loop
(fan-out to a thousand sockets) made a trip per statement cost milliseconds. With
``synchronous=NORMAL`` a lone small batch (:data:`INLINE_MAX`) is committed on the event
loop instead, the same job without the trip. Only after
the commit does the loop move the sequencer's head and the indexes, answer the
publishers (their futures, or at once through ``answer``) and hand the batch to fan-out
(``on_commit``): a publish is acknowledged only once durable, and a ``seq`` is never
handed out twice, even across a crash.

A publish that cannot be signed fails alone (its publisher gets the error; the rest of
the batch commits). A batch whose transaction fails for one of its messages is written
again one message at a time, so one bad message costs its own publish, never the others
nor the flush loop; when SQLite itself fails (disk full, I/O), the batch is refused with
``unavailable``.
The queue of pending messages is bounded (``max_pending``): past it a publish is refused
with ``unavailable`` and a ``retry_after_ms``, and so is a peer's message (gossip's
anti-entropy asks for it again later).

Storage is one SQLite row per committed batch (:mod:`hearthnet.pubsub.logstore`);
numbering, dedupe and topic stats are the pure
:class:`~hearthnet.pubsub.sequencer.Sequencer`; per-message lookups are served from the
in-memory :class:`~hearthnet.pubsub.logindex.LogIndex`, rebuilt when the log opens; reads
are :class:`~hearthnet.pubsub.logread.LogReader` (:attr:`MessageLog.reader`); durable
consumers' records are :attr:`MessageLog.consumers`, written with the next commit.

``synchronous=FULL`` (the default) makes an acknowledged publish survive a power cut;
``normal`` survives a process crash (``kill -9``) only.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast, overload

import aiosqlite

from hearthnet.clock import now_ms
from hearthnet.errors import StorageError, Unavailable
from hearthnet.identity import KeyPair
from hearthnet.pubsub.consumerstate import (
    ConsumerRecord,
    dirty_consumers,
    mark_clean,
    write_consumers,
)
from hearthnet.pubsub.envelope import Message, StoredMessage, unsigned_fields
from hearthnet.pubsub.logcommit import (
    Answer,
    Group,
    Outcome,
    Pending,
    answer_all,
    refuse,
    take_batch,
    write_batch,
)
from hearthnet.pubsub.logindex import LogIndex
from hearthnet.pubsub.logprune import Pruner
from hearthnet.pubsub.logread import PAGE, READ_LAST_QUERIES, LogReader
from hearthnet.pubsub.logstore import Row, SqliteWriter, load, transaction
from hearthnet.pubsub.payload import Base64UrlText
from hearthnet.pubsub.sequencer import Sequencer, TopicStats

__all__ = [
    "PAGE",
    "READ_LAST_QUERIES",
    "ConsumerRecord",
    "MessageLog",
    "PublishItem",
    "TopicStats",
]

log = logging.getLogger("hearthnet.pubsub.log")

# One publish of :meth:`MessageLog.publish_many`: topic, msg_type, data, ttl_s, sender.
PublishItem = tuple[str, str, Any, int | None, dict[str, str] | None]

MAX_PENDING = 16_384  # publishes queued for the writer (a few commits' worth)
PENDING_RETRY_MS = 200  # retry_after_ms when the queue is full: about one commit
# With synchronous=NORMAL (no fsync at commit, ~40 µs), a batch of at most this many
# messages with nothing queued behind it is committed on the event loop: the two thread
# hand-offs around it cost more than the commit (1 in flight is bound by them).
INLINE_MAX = 16


def _mirror(message_log: MessageLog) -> None:
    """Copy the sequencer's counters to the log's attributes (read across the node)."""
    seq = message_log.sequencer
    message_log.head_seq, message_log.origin_seq, message_log.total_bytes = (
        seq.head_seq,
        seq.origin_seq,
        seq.total_bytes,
    )


class MessageLog:
    """Append-only, deduplicated, group-committed log of every message the node holds:
    the commit pipeline here, reads in :attr:`reader`."""

    def __init__(
        self,
        path: Path,
        keys: KeyPair,
        *,
        synchronous: str = "full",
        max_batch: int = 1024,
        max_pending: int = MAX_PENDING,
        on_commit: Callable[[list[StoredMessage]], None] | None = None,
    ) -> None:
        self.path = path
        self.keys = keys
        self.synchronous = synchronous.upper()
        if self.synchronous not in ("FULL", "NORMAL"):
            raise StorageError("pubsub.sync must be 'full' or 'normal'")
        self.max_batch = max_batch
        self.max_pending = max_pending
        # Called after every commit, in order (the node registers its commit pipeline:
        # local fan-out, then gossip; see Node._wire).
        self.listeners: list[Callable[[list[StoredMessage]], None]] = (
            [on_commit] if on_commit else []
        )
        self.epoch = ""
        self.sequencer = Sequencer()
        self.index = LogIndex()
        # Mirrors of the sequencer's counters and stats, read by the rest of the node.
        self.head_seq = 0
        self.origin_seq = 0
        self.topics: dict[str, TopicStats] = self.sequencer.topics
        self.total_bytes = 0
        self.consumers: dict[tuple[str, str], ConsumerRecord] = {}
        # The consumers changed since their last write: what a commit looks at (not
        # every consumer the node holds, at every commit).
        self._changed: dict[tuple[str, str], ConsumerRecord] = {}
        self._writer: SqliteWriter | None = None
        self._reader: LogReader | None = None
        self._pruner: Pruner | None = None
        self._pending: list[Pending] = []
        self._queued_messages = 0  # in _pending (an entry may hold a group's run)
        # Batches the flush loop took from _pending and has not committed yet: one may
        # wait for the write lock (retention's transaction holds it), and nothing queued
        # after it may be committed before it (see end_turn).
        self._taken = 0
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._turn: asyncio.Handle | None = None  # end_turn is due (synchronous=NORMAL)
        self.batches = 0
        self.inline_batches = 0  # of which committed on the event loop (INLINE_MAX)
        self.closed = False

    @property
    def reader(self) -> LogReader:
        """The read side (history, catch-up, repair, retention candidates)."""
        if self._reader is None:
            raise StorageError("the message log is not open")
        return self._reader

    # --- opening and closing ------------------------------------------------------

    async def open(self) -> None:
        """Open (creating on first use, upgrading an older schema in place), load epoch
        and consumers, and rebuild the sequencer and the indexes from the rows."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = SqliteWriter(self.path, self.synchronous)
        try:
            state = await writer.run(lambda conn: load(conn, self.keys.node_id))
            conn = await aiosqlite.connect(f"file:{self.path}?mode=ro", uri=True)
            await conn.execute("PRAGMA query_only=1")
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a row's headers unreadable
            await writer.close()
            raise StorageError(f"cannot open the message log {self.path}: {exc}") from exc
        self.epoch, self.sequencer, self.index = state.epoch, state.sequencer, state.index
        self.topics = self.sequencer.topics
        _mirror(self)
        self.consumers.update(state.consumers)
        self._reader = LogReader(conn, self.index, self.topics)
        self._writer = writer
        self._pruner = Pruner(
            writer=writer,
            lock=self._write_lock,
            index=self.index,
            sequencer=self.sequencer,
            reader=self._reader,
            changed=partial(_mirror, self),
        )

    async def close(self) -> None:
        """Flush what is queued and the changed consumers, then close both connections."""
        if self.closed:
            return
        self.closed = True  # stops run(); what is queued is flushed here
        self._wake.set()
        writer = self._writer
        if writer is not None:
            if self._pending:
                await self._flush_all()
            await self.flush_consumers()
        if self._reader is not None:
            await self._reader.close()
        if writer is not None:
            await writer.close()
        self._reader = self._writer = self._pruner = None

    # --- appending ----------------------------------------------------------------

    def _room(self, count: int) -> None:
        """Raise unless ``count`` more publishes may be queued.

        Raises:
            Unavailable: the node is shutting down, or ``max_pending`` publishes wait.
        """
        if self.closed:
            raise Unavailable("the node is shutting down", retry_after_ms=1000)
        if self._queued_messages + count > self.max_pending:
            raise Unavailable(
                f"the message log has {self.max_pending} publishes waiting; retry",
                retry_after_ms=PENDING_RETRY_MS,
            )

    def publish(
        self,
        *,
        topic: str,
        msg_type: str,
        data: Any,
        ttl_s: int | None = None,
        sender: dict[str, str] | None = None,
    ) -> asyncio.Future[StoredMessage | None]:
        """Queue a local publish; the future resolves once it is committed (spec §6.4).

        The future fails with the publish's own error when it cannot be signed
        (:class:`~hearthnet.errors.NotCanonical`) or stored (``unavailable``).

        Raises:
            Unavailable: the node is shutting down, or ``max_pending`` publishes wait.
        """
        self._room(1)
        # Numbered now; its id given and signed with its batch in the writer thread
        # (ed25519 runs without the GIL, so parsing the next publishes goes on meanwhile).
        # A number whose batch fails to commit is never reused (peers treat it like a hole
        # left by retention); one issued but lost in a crash was never acknowledged.
        sequencer = self.sequencer
        self.origin_seq = sequencer.origin_seq = origin_seq = sequencer.origin_seq + 1
        kind = type(data)
        if ttl_s is None and kind is not bytes and kind is not Base64UrlText:
            # the usual publish, its fields inline (what unsigned_fields gives)
            body = {
                "id": "",
                "topic": topic,
                "type": msg_type,
                "data": data,
                "origin": self.keys.node_id,
                "origin_seq": origin_seq,
                "ts": now_ms(),
            }
            if sender is not None:
                body["sender"] = sender
        else:
            body = unsigned_fields(
                self.keys.node_id, topic, msg_type, data, origin_seq, now_ms(), ttl_s, sender, ""
            )
        fut: asyncio.Future[StoredMessage | None] = asyncio.get_running_loop().create_future()
        self._pending.append(Pending(fut, bodies=[body]))
        self._queued_messages += 1
        self._queued()
        return fut

    @overload
    def publish_many(
        self, items: Sequence[PublishItem], *, answer: None = None
    ) -> asyncio.Future[list[Outcome]]: ...

    @overload
    def publish_many(self, items: Sequence[PublishItem], *, answer: Answer) -> None: ...

    def publish_many(
        self, items: Sequence[PublishItem], *, answer: Answer | None = None
    ) -> asyncio.Future[list[Outcome]] | None:
        """Queue local publishes, each ``(topic, msg_type, data, ttl_s, sender)``, as one
        entry of the queue with one future for all: it resolves once every one is
        committed or refused, to each one's :class:`StoredMessage` or error, in order (one
        publish's error is its own, as with :meth:`publish`). The same numbering,
        signing and durability as :meth:`publish`, without a future or an entry per
        message. With ``answer`` there is no future: ``answer`` is called with the
        outcomes in the loop turn of the commit that decided the last of them, after
        that commit and before the commit listeners (fan-out) run.

        Raises:
            Unavailable: the node is shutting down, or the queue cannot take all of them
                (nothing is queued then).
        """
        count = len(items)
        self._room(count)
        future: asyncio.Future[list[Outcome]] | None = None
        if answer is None:
            future = asyncio.get_running_loop().create_future()
        if not count:
            if answer is not None:
                answer([])
            else:
                assert future is not None
                future.set_result([])
            return future
        node, ts, first = self.keys.node_id, now_ms(), self.sequencer.origin_seq + 1
        bodies: list[dict[str, Any]] = []
        plain = True  # every one the usual publish: committed by logrun.write_run
        for origin_seq, (topic, msg_type, data, ttl_s, sender) in enumerate(items, first):
            kind = type(data)
            if ttl_s is None and kind is not bytes and kind is not Base64UrlText:
                body = {  # the usual publish, its fields inline (as in publish)
                    "id": "",
                    "topic": topic,
                    "type": msg_type,
                    "data": data,
                    "origin": node,
                    "origin_seq": origin_seq,
                    "ts": ts,
                }
                if sender is not None:
                    body["sender"] = sender
            else:
                plain = False
                body = unsigned_fields(
                    node, topic, msg_type, data, origin_seq, ts, ttl_s, sender, ""
                )
            bodies.append(body)
        self.origin_seq = self.sequencer.origin_seq = first + count - 1
        group = Group(count, future, answer)
        self._pending.append(Pending(None, bodies=bodies, group=group, ts=ts if plain else None))
        self._queued_messages += count
        self._queued()
        return future

    def ingest(
        self, message: Message, source: str | None = None
    ) -> asyncio.Future[StoredMessage | None]:
        """Queue a verified message from a peer; resolves to None when it was a duplicate.
        Peers' messages share the queue's bound with local publishes.

        Raises:
            Unavailable: the node is shutting down, or ``max_pending`` messages wait.
        """
        fut: asyncio.Future[StoredMessage | None] = asyncio.get_running_loop().create_future()
        if self.sequencer.knows(message.id):
            fut.set_result(None)
            return fut
        self._room(1)
        self._pending.append(Pending(fut, message, source))
        self._queued_messages += 1
        self._queued()
        return fut

    def knows(self, message_id: str) -> bool:
        """True when the log holds the id (cheap dedupe before verifying)."""
        return self.sequencer.knows(message_id)

    def _queued(self) -> None:
        """A message was queued: with ``synchronous=NORMAL``, look at the queue once this
        loop turn's callbacks are done (what one read of a socket held is queued by
        then); otherwise wake the flush loop."""
        if self.synchronous != "NORMAL":
            self._wake.set()
        elif self._turn is None:
            self._turn = asyncio.get_running_loop().call_soon(self.end_turn)

    def end_turn(self) -> None:
        """With ``synchronous=NORMAL``, at the end of a loop turn that queued publishes
        (scheduled by the first of them, or called by a caller that runs at the end of
        the turn already: the WebSocket sessions' groups, which saves a loop turn):
        commit a lone small batch here (:data:`INLINE_MAX`, the writer idle, no commit
        or deletion under way, no batch taken by the flush loop and not yet committed),
        without the flush loop's task and lock; anything else, or a batch whose commit
        failed here, goes to the flush loop (which commits in queue order and answers
        failures). Nothing when no such turn is due.

        Commits follow the queue's order: ``seq`` is given at commit, ``origin_seq`` at
        queueing, and subscribers get a commit's messages in ``seq`` order. A batch the
        flush loop took may still wait for the write lock after retention released it
        (the lock is free until the flush loop's task runs again), so an idle writer and
        a free lock are not enough: a group queued meanwhile and committed here would
        take ``seq`` numbers before the earlier publishes (``_taken``)."""
        turn = self._turn
        if turn is None:
            return
        turn.cancel()  # called before its turn: not again in it
        self._turn = None
        batch, writer = self._pending, self._writer
        if (
            batch
            and self._queued_messages <= min(INLINE_MAX, self.max_batch)
            and not self.closed
            and writer is not None
            and writer.idle
            and not self._write_lock.locked()
            and not self._taken
        ):
            consumers = dirty_consumers(self._changed)
            job = partial(
                write_batch,
                keys=self.keys,
                batch=batch,
                sequencer=self.sequencer,
                consumers=consumers,
            )
            try:
                outcomes, rows = writer.run_here(job)
            except Exception:  # nothing was committed: the flush loop tries again
                log.debug("inline commit of %d messages failed; queued again", len(batch))
            else:
                self._pending = []
                self._queued_messages = 0
                mark_clean(consumers, self._changed)
                self.inline_batches += 1
                self._done(batch, outcomes, rows)
                return
        if batch:
            self._wake.set()

    async def run(self) -> None:
        """The flush loop: one transaction per batch, as soon as the previous one is done."""
        while not self.closed:
            await self._wake.wait()
            self._wake.clear()
            if not self.closed:
                await self._flush_all()

    async def _flush_all(self) -> None:
        while self._pending:
            # the next batch: up to max_batch messages (see take_batch)
            queued, limit = self._queued_messages, self.max_batch
            batch, self._pending = take_batch(self._pending, queued, limit)
            self._queued_messages = queued - min(queued, limit)  # one past limit holds limit
            self._taken += 1  # until committed: end_turn commits nothing queued after it
            try:
                await self._commit(batch)
            finally:
                self._taken -= 1

    async def _commit(self, batch: list[Pending]) -> None:
        """Commit one batch (counters move only after it committed); when its transaction
        fails, each message alone.

        Never raises: every failure ends up on the publishes it concerns.
        """
        assert self._writer is not None
        try:
            async with self._write_lock:
                # Snapshots for the writer thread: what it reads must not change under it.
                # The writer thread reads the sequencer (ids, head), which changes only
                # in _done, on the loop, after this job.
                consumers = dirty_consumers(self._changed)
                keys, sequencer, writer = self.keys, self.sequencer, self._writer

                def job(conn: sqlite3.Connection) -> tuple[list[Outcome], list[Row]]:
                    return write_batch(conn, keys, batch, sequencer=sequencer, consumers=consumers)

                if (
                    self.synchronous == "NORMAL"
                    and len(batch) <= INLINE_MAX  # entries: at most as many as messages
                    and not self._pending
                    and writer.idle
                    and sum(p.size for p in batch) <= INLINE_MAX
                ):
                    # A lone small batch: committed here, durable (against a crash) before
                    # it is acknowledged all the same, without waking the writer thread.
                    outcomes, rows = writer.run_here(job)
                    self.inline_batches += 1
                else:
                    outcomes, rows = await writer.run(job)
                mark_clean(consumers, self._changed)
        except Exception as exc:  # a flush loop that dies stops every publish
            # A full disk, an I/O error or a lock (OperationalError) fails every message
            # alike; anything else may be one message's doing, so the others go alone.
            singles = [single for pending in batch for single in pending.singles()]
            if len(singles) == 1 or isinstance(exc, sqlite3.OperationalError):
                refuse(batch, exc)
                return
            log.warning(
                "commit of %d messages failed (%s); writing them one by one", len(singles), exc
            )
            for single in singles:
                await self._commit([single])
            return
        self._done(batch, outcomes, rows)

    def _done(self, batch: list[Pending], outcomes: list[Outcome], rows: list[Row]) -> None:
        """After a commit: move the heads and indexes, answer publishers, hand the batch
        to fan-out."""
        self.batches += 1
        index, sequencer = self.index, self.sequencer
        stored = 0
        for row in rows:
            cols = row.columns()
            index.add_columns(row.key, cols)
            sequencer.committed_columns(cols.seqs, cols.ids, cols.topics, cols.sizes, cols.ts)
            stored += len(cols.seqs)
        _mirror(self)
        # Publishers first: an answer given at once (``answer``, the WebSocket path) is
        # queued before the deliveries, so it leaves first in the loop turn's one flush.
        answer_all(batch, outcomes)
        # The rows hold what was stored: when that is every outcome (the usual commit, no
        # duplicate nor refusal), a copy of them, without a look at each.
        committed = (
            cast("list[StoredMessage]", outcomes.copy())
            if stored == len(outcomes)
            else [item for item in outcomes if isinstance(item, StoredMessage)]
        )
        for listener in self.listeners:
            try:
                listener(committed)
            except Exception:
                # What is committed stays committed: a listener's bug is logged.
                log.exception("a commit listener failed")

    # --- durable consumers --------------------------------------------------------

    def save_consumer(self, record: ConsumerRecord) -> None:
        """Create or change a consumer; written with the next commit (or close). The
        flush loop is not woken: it commits only queued messages, so a wake-up per
        durable consumer's ack was a loop turn for nothing."""
        record.dirty = True
        key = (record.identity, record.name)
        self._changed[key] = record
        if record.deleted:  # gone at once; its row with the next write
            if self.consumers.get(key) is record:
                del self.consumers[key]
        else:
            self.consumers[key] = record

    async def flush_consumers(self) -> None:
        """Write the changed consumers now, under the write lock (after any commit that
        is writing them): a deleted consumer's row is gone when this returns."""
        writer = self._writer
        if writer is None:
            return
        async with self._write_lock:
            written = dirty_consumers(self._changed)
            if written:
                await writer.run(
                    lambda conn: transaction(conn, lambda: write_consumers(conn, written))
                )
                mark_clean(written, self._changed)

    # --- retention ----------------------------------------------------------------

    async def delete(
        self,
        seqs: Sequence[int] = (),
        *,
        before_seq: int = 0,
        elsewhere: Mapping[str, int] | None = None,
    ) -> int:
        """Delete (retention) every message below ``before_seq`` and the messages at
        ``seqs``, in transactions of bounded size with commits in between; keeps topic
        stats and indexes exact (:class:`~hearthnet.pubsub.logprune.Pruner`).
        ``elsewhere``: per origin, the origin_seq up to which retention removed its
        messages on the mesh (gossip skipped them on a peer's floor), recorded with
        this node's own (:mod:`~hearthnet.pubsub.logfloors`)."""
        if self._pruner is None:
            raise StorageError("the message log is not open")
        return await self._pruner.delete(seqs, before_seq=before_seq, elsewhere=elsewhere)
