"""Reads of the message log (spec §6.3, §6.5, §7.3): history, catch-up, gossip repair,
retention candidates.

The reader has its own connection (WAL lets it read beside the writer). A row stored
without ``sig`` (a member of a batch signed here, see :mod:`hearthnet.pubsub.logstore`)
comes back holding its batch, read once and kept in a bounded cache; its proof is made
only when the message is sent with ``sig``.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import aiosqlite
import orjson

from hearthnet.clock import now_ms
from hearthnet.errors import StorageError
from hearthnet.pubsub.batchsig import SignedBatch
from hearthnet.pubsub.envelope import Message, StoredMessage
from hearthnet.pubsub.logstore import UNEXPIRED, TopicStats, topic_filter
from hearthnet.pubsub.merkle import HASH_BYTES
from hearthnet.pubsub.topics import TopicPattern

ROW = "seq, raw, origin, batch"  # what :meth:`LogReader._rows` reads
PAGE = 500
READ_LAST_QUERIES = 2000  # since {last: N}: most topics read one by one before walking back
READ_LAST_SEARCH = 10_000  # ... and most topics in the log searched for matches
BATCH_CACHE = 256  # batches kept for reads (a batch of 125: ~4 KiB of leaves, its tree ~8)


class LogReader:
    """The log's read side, on its own read-only connection."""

    def __init__(self, conn: aiosqlite.Connection, topics: dict[str, TopicStats]) -> None:
        self._conn = conn
        self.topics = topics  # the log's topic stats (shared, kept by the writer side)
        self._batches: OrderedDict[tuple[str, int], SignedBatch] = OrderedDict()

    async def close(self) -> None:
        """Close the connection."""
        await self._conn.close()

    async def _fetch(self, sql: str, args: Iterable[Any]) -> list[Any]:
        """Rows of ``SELECT {ROW} ...``, with the batches of those stored without sig read
        into the cache."""
        try:
            rows = await self._conn.execute_fetchall(sql, tuple(args))
            wanted = {
                (o, b) for _, _, o, b in rows if b is not None and (o, b) not in self._batches
            }
            if wanted:
                await self._load_batches(wanted)
        except sqlite3.Error as exc:
            raise StorageError(f"reading the message log failed: {exc}") from exc
        return list(rows)

    async def _rows(self, sql: str, args: Iterable[Any]) -> list[StoredMessage]:
        """Messages from ``SELECT {ROW} ...``, each with its batch when stored without sig."""
        rows = await self._fetch(sql, args)
        # Stored messages were verified before they were stored: rebuilt without paying
        # for the signature again.
        out = [
            StoredMessage(seq, self._message(raw, origin, first))
            for seq, raw, origin, first in rows
        ]
        self._trim()
        return out

    def _trim(self) -> None:
        """Bound the batch cache (after the rows that needed its batches were built)."""
        while len(self._batches) > BATCH_CACHE:
            self._batches.popitem(last=False)

    def _message(self, raw: bytes, origin: str, first: int | None) -> Message:
        """A stored row as a message: the whole envelope, or a batch member without sig."""
        if first is None:
            return Message.trusted(orjson.loads(raw), raw)
        batch = self._batches.get((origin, first))
        if batch is None:
            raise StorageError(f"the message log lost batch {first} of {origin}")
        self._batches.move_to_end((origin, first))
        return Message.in_batch(orjson.loads(raw), raw, batch)

    async def _load_batches(self, wanted: set[tuple[str, int]]) -> None:
        """Read these batches into the cache (:meth:`_rows` bounds it after use)."""
        by_origin: dict[str, list[int]] = {}
        for origin, first in wanted:
            by_origin.setdefault(origin, []).append(first)
        for origin, firsts in by_origin.items():
            for i in range(0, len(firsts), 500):
                chunk = firsts[i : i + 500]
                for first, sig, leaves in await self._conn.execute_fetchall(
                    "SELECT first, sig, leaves FROM batches WHERE origin = ?"
                    f" AND first IN ({','.join('?' * len(chunk))})",
                    (origin, *chunk),
                ):
                    hashes = [leaves[j : j + HASH_BYTES] for j in range(0, len(leaves), HASH_BYTES)]
                    self._batches[(origin, first)] = SignedBatch(origin, first, sig, hashes)

    async def read_matching(
        self,
        patterns: list[TopicPattern],
        *,
        after_seq: int,
        upto_seq: int,
        min_ts: int | None = None,
        limit: int = PAGE,
    ) -> list[StoredMessage]:
        """Messages matching any pattern with ``after_seq < seq <= upto_seq``, oldest first."""
        if after_seq >= upto_seq or not patterns:
            return []
        where, topic_args = topic_filter(patterns)
        args: list[Any] = [after_seq, upto_seq, *topic_args, now_ms()]
        ts_clause = " AND ts >= ?" if min_ts is not None else ""
        if min_ts is not None:
            args.append(min_ts)
        out: list[StoredMessage] = []
        cursor = after_seq
        while len(out) < limit and cursor < upto_seq:
            page_args = [cursor, *args[1:]]
            rows = await self._rows(
                f"SELECT {ROW} FROM messages WHERE seq > ? AND seq <= ? AND ({where})"
                f" AND {UNEXPIRED}{ts_clause} ORDER BY seq LIMIT {PAGE}",
                page_args,
            )
            if not rows:
                break
            out += [r for r in rows if any(p.matches(r.message.topic) for p in patterns)]
            cursor = rows[-1].seq
            if len(rows) < PAGE:
                break
        return out[:limit]

    async def read_last(
        self,
        patterns: list[TopicPattern],
        count: int,
        *,
        upto_seq: int,
        keep: Callable[[str], bool] | None = None,
    ) -> list[StoredMessage]:
        """The last ``count`` messages matching the patterns up to ``upto_seq``, oldest
        first; with ``keep``, only messages of topics it keeps count."""
        if not patterns or count < 1:
            return []
        topics = self._topics_matching(patterns)
        if topics is not None:
            if keep is not None:
                topics = [t for t in topics if keep(t)]
            newest = await self._read_last_by_topic(topics, count, upto_seq)
            if newest is not None:
                return newest
        # Too many topics to go through: walk back through the log a page at a time (a
        # range on the topic index would have SQLite sort every row in the range).
        found: list[StoredMessage] = []
        before = upto_seq + 1
        while len(found) < count and before > 1:
            rows = await self._rows(
                f"SELECT {ROW} FROM messages WHERE seq < ? AND {UNEXPIRED}"
                f" ORDER BY seq DESC LIMIT {PAGE}",
                [before, now_ms()],
            )
            if not rows:
                break
            found += [
                r
                for r in rows
                if any(p.matches(r.message.topic) for p in patterns)
                and (keep is None or keep(r.message.topic))
            ]
            before = rows[-1].seq
        return sorted(found[:count], key=lambda r: r.seq)

    async def _read_last_by_topic(
        self, topics: list[str], count: int, upto_seq: int
    ) -> list[StoredMessage] | None:
        """The newest ``count`` rows of ``topics`` from the topic index, a topic at a time,
        newest topic first: a quiet topic behind a busy log costs ``count`` rows, not a scan
        of everything newer. Stops as soon as no topic left can hold one of the newest
        (each topic's head is known), so about ``count`` topics are read at most; None when
        that would take more than :data:`READ_LAST_QUERIES` reads."""
        heads = sorted(
            (
                (min(stats.head_seq, upto_seq), topic)
                for topic in topics
                if (stats := self.topics.get(topic)) is not None
            ),
            reverse=True,
        )
        newest: list[tuple[int, StoredMessage]] = []  # a min-heap of at most ``count``
        now = now_ms()
        for reads, (head, topic) in enumerate(heads):
            if len(newest) == count and newest[0][0] > head:
                break  # every row left is older than the newest ``count`` found
            if reads == READ_LAST_QUERIES:
                return None
            # Once ``count`` are found, only rows newer than the oldest of them matter.
            floor = newest[0][0] if len(newest) == count else 0
            for row in await self._rows(
                f"SELECT {ROW} FROM messages WHERE topic = ? AND seq <= ? AND seq > ?"
                f" AND {UNEXPIRED} ORDER BY seq DESC LIMIT ?",
                [topic, upto_seq, floor, now, count],
            ):
                if len(newest) < count:
                    heapq.heappush(newest, (row.seq, row))
                elif row.seq > newest[0][0]:
                    heapq.heapreplace(newest, (row.seq, row))
                else:
                    break  # the rest of this topic is older still
        return [row for _, row in sorted(newest, key=lambda pair: pair[0])]

    def _topics_matching(self, patterns: list[TopicPattern]) -> list[str] | None:
        """The topics in the log that the patterns match, found in the in-memory topic
        stats; None when the log has too many topics to search."""
        names = {p.text for p in patterns if p.is_literal}
        wildcards = [p for p in patterns if not p.is_literal]
        if wildcards:
            if len(self.topics) > READ_LAST_SEARCH:
                return None
            names.update(t for t in self.topics if any(p.matches(t) for p in wildcards))
        return list(names)

    async def history(
        self,
        topic: str,
        *,
        since_seq: int | None = None,
        since_ts: int | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> tuple[list[StoredMessage], bool]:
        """A page of one topic's history, oldest first, and whether there is more (spec §6.5).

        ``since_seq``/``since_ts`` page forward (``has_more``: newer messages remain);
        ``before_seq``, or neither, pages backward from the newest (``has_more``: older remain).
        """
        if since_seq is not None or since_ts is not None:
            clauses: list[str] = ["topic = ?", UNEXPIRED]
            args: list[Any] = [topic, now_ms()]
            if since_seq is not None:
                clauses.append("seq > ?")
                args.append(since_seq)
            if since_ts is not None:
                clauses.append("ts >= ?")
                args.append(since_ts)
            if before_seq is not None:
                clauses.append("seq < ?")
                args.append(before_seq)
            rows = await self._rows(
                f"SELECT {ROW} FROM messages WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?",
                [*args, limit + 1],
            )
            return rows[:limit], len(rows) > limit
        clauses = ["topic = ?", UNEXPIRED]
        args = [topic, now_ms()]
        if before_seq is not None:
            clauses.append("seq < ?")
            args.append(before_seq)
        rows = await self._rows(
            f"SELECT {ROW} FROM messages WHERE {' AND '.join(clauses)} ORDER BY seq DESC LIMIT ?",
            [*args, limit + 1],
        )
        return sorted(rows[:limit], key=lambda r: r.seq), len(rows) > limit

    async def origin_heads(self) -> list[tuple[str, int, int, list[int]]]:
        """Per origin: ``(origin, floor, head, above)`` where ``head`` is the end of the
        contiguous run of origin_seqs starting at the lowest held (``floor``), and
        ``above`` the seqs held beyond a hole (bounded) — the gossip tracker's start."""
        rows = await self._conn.execute_fetchall(
            "WITH g AS (SELECT origin, origin_seq,"
            " origin_seq - ROW_NUMBER() OVER (PARTITION BY origin ORDER BY origin_seq) AS grp"
            " FROM messages),"
            " f AS (SELECT origin, MIN(grp) AS first FROM g GROUP BY origin)"
            " SELECT g.origin, MIN(g.origin_seq), MAX(g.origin_seq) FROM g JOIN f"
            " ON g.origin = f.origin AND g.grp = f.first GROUP BY g.origin"
        )
        firsts = {o: (lo, hi) for o, lo, hi in rows}
        rows = await self._conn.execute_fetchall(
            "WITH g AS (SELECT origin, origin_seq,"
            " origin_seq - ROW_NUMBER() OVER (PARTITION BY origin ORDER BY origin_seq) AS grp"
            " FROM messages),"
            " f AS (SELECT origin, MIN(grp) AS first FROM g GROUP BY origin)"
            " SELECT g.origin, g.origin_seq FROM g JOIN f ON g.origin = f.origin"
            " WHERE g.grp <> f.first LIMIT 100000"
        )
        above: dict[str, list[int]] = {}
        for origin, seq in rows:
            above.setdefault(origin, []).append(seq)
        return [(o, lo, hi, above.get(o, [])) for o, (lo, hi) in firsts.items()]

    async def read_origin(self, origin: str, first: int, last: int, limit: int) -> list[bytes]:
        """Raw envelopes of one origin with ``first <= origin_seq <= last`` (repair)."""
        rows = await self._fetch(
            f"SELECT {ROW} FROM messages WHERE origin = ? AND origin_seq BETWEEN ? AND ?"
            " ORDER BY origin_seq LIMIT ?",
            (origin, first, last, max(0, limit)),
        )
        # A whole envelope goes as stored; a batch member gets its proof.
        out = [
            bytes(raw) if batch is None else self._message(raw, o, batch).raw
            for _, raw, o, batch in rows
        ]
        self._trim()
        return out

    async def candidates(
        self, sql_where: str, args: list[Any], limit: int
    ) -> list[tuple[int, str, int]]:
        """``(seq, topic, ts)`` of rows matching a retention condition, oldest first."""
        rows = await self._conn.execute_fetchall(
            f"SELECT seq, topic, ts FROM messages WHERE {sql_where} ORDER BY seq LIMIT ?",
            [*args, limit],
        )
        return [(int(s), str(t), int(ts)) for s, t, ts in rows]

    async def nth_newest_seq(self, topic: str, n: int) -> int | None:
        """The seq of the n-th newest message of a topic (1 = newest)."""
        rows = list(
            await self._conn.execute_fetchall(
                "SELECT seq FROM messages WHERE topic = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
                (topic, n - 1),
            )
        )
        return int(rows[0][0]) if rows else None
