"""Retention's deletes from the message log (spec §6.3, §6.8).

Most of what retention deletes is a prefix of the log: the oldest messages, every seq
below a bound. Rows (one per committed batch, keyed by their first seq: see
:mod:`hearthnet.pubsub.logstore`) hold runs of consecutive seqs, so a prefix is the rows
below one key, gone in one range ``DELETE``, and at most one row that straddles the bound,
rewritten; the indexes cut it with slices (:meth:`LogIndex.cut_prefix`), the sequencer
drops the ids and stats as columns. What retention deletes above the prefix (a topic's
oldest while an older message of another topic stays, a ttl that ran out, what a durable
consumer no longer holds) goes message by message: each row that holds some is deleted
or rewritten (:func:`~hearthnet.pubsub.logcommit.delete_rows`).

Either way the work runs in the writer thread in transactions of bounded time: each takes
as many messages as the last one's pace fits in :data:`CHUNK_TARGET_S` (:class:`ChunkSize`),
and commits queued meanwhile go in between, so a pass never holds publishes for long (spec
§11's p99: one 20,000-message transaction held every commit for 110–135 ms). The indexes
follow each prefix transaction, and the scattered deletes once all their transactions are
done (a read meanwhile leaves out what is gone from the rows).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import orjson

from hearthnet.errors import StorageError
from hearthnet.pubsub.floorruns import Removed
from hearthnet.pubsub.logcommit import delete_rows
from hearthnet.pubsub.logfloors import merge, removal, save_removed, skips
from hearthnet.pubsub.logindex import Head, LogIndex
from hearthnet.pubsub.logread import LogReader
from hearthnet.pubsub.logstore import SqliteWriter, head_arrays, transaction
from hearthnet.pubsub.sequencer import Sequencer

CHUNK_TARGET_S = 0.005  # writer time a retention transaction aims at
PREFIX_CHUNK_MAX = 4_000  # messages of a prefix in one transaction (see Pruner.__init__)


@dataclass(slots=True)
class ChunkSize:
    """How many messages retention's next transaction takes: what the last one's pace
    fits in ``target_s``, at most twice the last size, within ``low`` .. ``high``."""

    size: int
    low: int
    high: int
    target_s: float = CHUNK_TARGET_S

    def took(self, count: int, elapsed_s: float) -> None:
        """A transaction deleted ``count`` messages in ``elapsed_s`` of wall time."""
        if count <= 0:
            return
        fits = int(count * self.target_s / max(elapsed_s, 1e-6))
        self.size = max(self.low, min(self.high, 2 * self.size, fits))


T = TypeVar("T")


@dataclass(slots=True)
class Pruned:
    """What one prefix transaction deleted: the rows gone (ascending), every row it
    changed, and the deleted messages' ids, topics and sizes (one entry per message)."""

    rows: list[int] = field(default_factory=list)
    touched: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    gone: dict[str, list[int]] = field(default_factory=dict)  # per origin, its origin_seqs
    removed: dict[str, Removed] = field(default_factory=dict)  # the records that changed

    def take(self, heads: list[list[Any]], origin: str) -> None:
        """Count the deleted messages of a ``heads`` column (as JSON arrays) of a row of
        ``origin`` (a header's origin ``""`` is the row's)."""
        if heads:
            _, ids, topics, origins, oseqs, _, _, sizes = zip(*heads, strict=True)
            self.ids += ids
            self.topics += topics
            self.sizes += sizes
            gone = self.gone
            for o, s in zip((h or origin for h in origins), oseqs, strict=True):
                seqs = gone.get(o)
                if seqs is None:
                    gone[o] = [s]
                else:
                    seqs.append(s)


def save_counters(conn: sqlite3.Connection, origin_seq: int, head_seq: int) -> None:
    """The counters must survive the deletion of the newest messages; the commit path does
    not write them (the log reads them back when it opens)."""
    conn.executemany(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
        [("origin_seq", str(origin_seq)), ("head_seq", str(head_seq))],
    )


def delete_before(
    conn: sqlite3.Connection, *, index: LogIndex, before_seq: int, origin_seq: int, head_seq: int
) -> Pruned:
    """Delete every message with a seq below ``before_seq`` in one transaction: the rows
    below the last row that starts below it in one range ``DELETE``; that row deleted
    when it holds nothing else, else rewritten with the rest (its batch's signature and
    leaves unchanged). Only the rows' headers are read, and the one rewritten row's
    bodies. The removed origin_seqs are recorded
    (:func:`~hearthnet.pubsub.logfloors.removal`, against ``index`` before the removal)."""

    def work() -> Pruned:
        save_counters(conn, origin_seq, head_seq)
        out = Pruned()
        found = conn.execute(
            "SELECT seq, heads, origin FROM batches WHERE seq < ? ORDER BY seq", (before_seq,)
        ).fetchall()
        if not found:
            return out
        for _, blob, origin in found[:-1]:  # below the next row's key: below before_seq
            out.take(head_arrays(blob), origin)
        last = found[-1][0]
        heads = head_arrays(found[-1][1])
        below = [h for h in heads if h[0] < before_seq]
        whole = len(below) == len(heads)
        out.touched = [key for key, _, _ in found]
        out.rows = out.touched if whole else out.touched[:-1]
        out.take(below, found[-1][2])
        if not whole:
            (bodies,) = conn.execute("SELECT bodies FROM batches WHERE seq = ?", (last,)).fetchone()
            kept, kept_bodies, at = [], [], 0
            for head in heads:
                if head[0] >= before_seq:
                    kept.append(head)
                    kept_bodies.append(bodies[at : at + head[7]])
                at += head[7]
            conn.execute(
                "UPDATE batches SET heads = ?, bodies = ? WHERE seq = ?",
                (orjson.dumps(kept), b"".join(kept_bodies), last),
            )
        conn.execute("DELETE FROM batches WHERE seq < ?", (last + 1 if whole else last,))
        out.removed = removal(index, out.gone)
        save_removed(conn, out.removed)
        return out

    return transaction(conn, work)


def _save_skips(
    conn: sqlite3.Connection, index: LogIndex, elsewhere: Mapping[str, int]
) -> dict[str, Removed]:
    """The records of gossip's skips, saved in a transaction of their own."""

    def work() -> dict[str, Removed]:
        records = skips(index, elsewhere)
        save_removed(conn, records)
        return records

    return transaction(conn, work)


class Pruner:
    """Runs retention's deletes against the log's writer and keeps the log's indexes,
    stats and read cache in step (see the module's docstring)."""

    def __init__(
        self,
        *,
        writer: SqliteWriter,
        lock: asyncio.Lock,
        index: LogIndex,
        sequencer: Sequencer,
        reader: LogReader,
        changed: Callable[[], None],
    ) -> None:
        self.writer = writer
        self.lock = lock  # the log's write lock: a transaction at a time
        self.index = index
        self.sequencer = sequencer
        self.reader = reader
        self.changed = changed  # the sequencer's counters moved (the log mirrors them)
        # Messages of a prefix a transaction. At most 4,000: a retention commit does not
        # sync, so the frames it leaves in the WAL (~440 bytes a deleted message) are
        # flushed by the next publish's commit, which the chunk's time does not show.
        self.prefix_chunk = ChunkSize(2_000, low=256, high=PREFIX_CHUNK_MAX)
        self.scattered_chunk = ChunkSize(500, low=64, high=2_000)  # messages one by one

    async def _run(self, job: Callable[[sqlite3.Connection], T]) -> tuple[T, float]:
        """Run one transaction; its result and how long the writer took."""
        try:
            async with self.lock:
                started = time.perf_counter()
                result = await self.writer.run(job, fsync=False)
                return result, time.perf_counter() - started
        except sqlite3.Error as exc:
            raise StorageError(f"retention could not delete: {exc}") from exc

    async def delete(
        self,
        seqs: Sequence[int] = (),
        *,
        before_seq: int = 0,
        elsewhere: Mapping[str, int] | None = None,
    ) -> int:
        """Delete every message below ``before_seq`` and the messages at ``seqs``; how
        many were deleted. ``elsewhere``: see :meth:`MessageLog.delete`."""
        if elsewhere:
            records, _ = await self._run(
                partial(_save_skips, index=self.index, elsewhere=dict(elsewhere))
            )
            merge(self.index, records)
        deleted = await self._delete_prefix(before_seq) if before_seq else 0
        index, sequencer = self.index, self.sequencer
        gone: list[Head] = []
        emptied: list[int] = []
        chunk = self.scattered_chunk
        try:
            i = 0
            while i < len(seqs):
                await asyncio.sleep(0)  # let the flush loop take the write lock
                doomed: dict[int, set[int]] = {}
                part = seqs[i : i + chunk.size]
                i += len(part)
                for seq in part:
                    doomed.setdefault(index.row_of(seq), set()).add(seq)
                job = partial(
                    delete_rows,
                    index=index,
                    doomed=doomed,
                    origin_seq=sequencer.origin_seq,
                    head_seq=sequencer.head_seq,
                )
                (chunk_gone, chunk_emptied, records), elapsed = await self._run(job)
                chunk.took(len(part), elapsed)
                gone += chunk_gone
                emptied += chunk_emptied
                merge(index, records)
                self.reader.drop(doomed)
        finally:
            # The indexes follow once (each touched topic's and origin's arrays are
            # copied once a pass, not once a chunk); meanwhile reads leave out what is
            # gone from the rows.
            index.remove(gone, emptied)
            sequencer.forget(gone)
            self.changed()
        return deleted + len(gone)

    def _row_bound(self, seq: int, before_seq: int) -> int:
        """Where a chunk that would end at ``seq`` ends: at the first seq of the row that
        holds it, so that the chunk's rows go whole by the range ``DELETE``, or, when
        ``seq`` is in the first row held, at the next row (a bound inside a row rewrites
        the row with the rest of its bodies: a row of 1,000 messages cut by every chunk
        made a chunk's transaction cost as much as deleting a thousand); never past
        ``before_seq``."""
        rows, cols = self.index.rows, self.index.cols
        at = bisect_right(rows, seq) - 1
        if at >= 0 and rows[at] > cols.seqs[cols.base]:
            return min(rows[at], before_seq)
        return min(rows[at + 1], before_seq) if at + 1 < len(rows) else before_seq

    async def _delete_prefix(self, before_seq: int) -> int:
        """Every message below ``before_seq``, about :attr:`prefix_chunk` positions of
        the index a transaction (ending at a row's first seq: :meth:`_row_bound`)."""
        deleted = 0
        while True:
            cols = self.index.cols
            end = cols.position(before_seq)
            if end <= cols.base:
                return deleted
            step = cols.after_live(self.prefix_chunk.size)
            bound = before_seq if step >= end else self._row_bound(cols.seqs[step], before_seq)
            if deleted:
                await asyncio.sleep(0)  # let the flush loop take the write lock
            sequencer = self.sequencer
            pruned, elapsed = await self._run(
                partial(
                    delete_before,
                    index=self.index,
                    before_seq=bound,
                    origin_seq=sequencer.origin_seq,
                    head_seq=sequencer.head_seq,
                )
            )
            self.prefix_chunk.took(len(pruned.ids), elapsed)
            self.index.cut_prefix(bound, pruned.rows)
            merge(self.index, pruned.removed)
            sequencer.forget_columns(pruned.ids, pruned.topics, pruned.sizes)
            self.reader.drop(pruned.touched)
            self.changed()
            deleted += len(pruned.ids)
