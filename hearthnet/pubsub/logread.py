"""Reads of the message log (spec §6.3, §6.5, §7.3): history, catch-up, gossip repair.

Which messages a read wants is found in the in-memory indexes
(:class:`~hearthnet.pubsub.logindex.LogIndex`); their rows (one per committed batch, see
:mod:`hearthnet.pubsub.logstore`) are read on the reader's own connection (WAL lets it
read beside the writer) and kept in a bounded cache, since a catch-up reads its rows'
messages in order. A batch member comes back holding its batch; its proof is made only
when the message is sent with ``sig``.
"""

from __future__ import annotations

import asyncio
import heapq
import sqlite3
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import aiosqlite
import orjson

from hearthnet.clock import now_ms
from hearthnet.errors import StorageError
from hearthnet.pubsub.batchsig import SignedBatch
from hearthnet.pubsub.envelope import Message, StoredMessage
from hearthnet.pubsub.logindex import NO_EXPIRY, Head, LogIndex, OriginHead
from hearthnet.pubsub.logstore import leaf_hashes, split_bodies, unpack_heads
from hearthnet.pubsub.sequencer import TopicStats
from hearthnet.pubsub.topics import TopicPattern

PAGE = 500
READ_LAST_QUERIES = 2000  # since {last: N}: most topics read one by one before walking back
READ_LAST_SEARCH = 10_000  # ... and most topics in the log searched for matches
ROW_CACHE = 64  # rows kept for reads (a row: up to a commit's worth of messages)
SCAN_YIELD = 65_536  # index entries a walk back through the log looks at between yields


def held_span(
    lists: Sequence[Sequence[int]], after: int, upto: int, n: int
) -> tuple[int | None, int | None]:
    """In the union of ``lists`` (each ascending, no value in two of them, as topics'
    seqs), between ``after`` (excluded) and ``upto``: the smallest value and the ``n``-th
    smallest, each None when there are not that many.

    Found by position, not by walking: the smallest is each list's first in the window;
    in one list the ``n``-th is indexed directly, and over several a search by value
    narrows each list's window at every step (what lies below the step is counted off,
    what lies above is dropped), so lists leave the search as their windows empty."""
    if n < 1:
        raise ValueError("n counts from 1")
    windows = []
    for seqs in lists:
        lo, hi = bisect_right(seqs, after), bisect_right(seqs, upto)
        if lo < hi:
            windows.append((seqs, lo, hi))
    first = min((s[lo] for s, lo, _ in windows), default=None)
    if sum(hi - lo for _, lo, hi in windows) < n:
        return first, None
    low, high = after + 1, upto  # the answer is the least v with n values in [low, v]
    while len(windows) > 1 and low < high:
        mid = (low + high) // 2
        cuts = [bisect_right(s, mid, lo, hi) for s, lo, hi in windows]
        below = sum(cut - w[1] for cut, w in zip(cuts, windows, strict=True))
        if below >= n:
            high = mid
            windows = [(s, lo, c) for c, (s, lo, _) in zip(cuts, windows, strict=True) if c > lo]
        else:
            n, low = n - below, mid + 1
            windows = [(s, c, hi) for c, (s, _, hi) in zip(cuts, windows, strict=True) if c < hi]
    if len(windows) == 1:
        seqs, lo, _ = windows[0]
        return first, seqs[lo + n - 1]
    return first, low


@dataclass(slots=True)
class TopicMask:
    """Which topic numbers some patterns match (:meth:`LogReader.topic_mask`), and the
    index's list of names it numbers (a new one when topics are numbered afresh)."""

    names: list[str]
    bits: bytearray


@dataclass(slots=True)
class _CachedRow:
    batch: SignedBatch | None
    messages: dict[int, tuple[Head, bytes]]


class LogReader:
    """The log's read side: the indexes, and rows on their own read-only connection."""

    def __init__(
        self, conn: aiosqlite.Connection, index: LogIndex, topics: dict[str, TopicStats]
    ) -> None:
        self._conn = conn
        self.index = index
        self.topics = topics  # the log's topic stats (shared, kept by the sequencer)
        self._rows: OrderedDict[int, _CachedRow] = OrderedDict()

    async def close(self) -> None:
        """Close the connection."""
        await self._conn.close()

    def drop(self, keys: Iterable[int]) -> None:
        """Forget cached rows (retention rewrote or deleted them)."""
        for key in keys:
            self._rows.pop(key, None)

    async def messages(self, seqs: list[int]) -> list[StoredMessage]:
        """The messages at these seqs, in the order given (a seq no longer held is left
        out)."""
        keys = {self.index.row_of(seq) for seq in seqs}
        missing = [k for k in keys if k not in self._rows]
        try:
            for i in range(0, len(missing), 500):
                chunk = missing[i : i + 500]
                for (
                    key,
                    origin,
                    first,
                    sig,
                    leaves,
                    heads,
                    bodies,
                ) in await self._conn.execute_fetchall(
                    "SELECT seq, origin, first, sig, leaves, heads, bodies FROM batches"
                    f" WHERE seq IN ({','.join('?' * len(chunk))})",
                    chunk,
                ):
                    held = unpack_heads(heads, origin)
                    batch = SignedBatch(origin, first, sig, leaf_hashes(leaves)) if origin else None
                    self._rows[key] = _CachedRow(
                        batch,
                        {
                            h.seq: (h, body)
                            for h, body in zip(held, split_bodies(held, bodies), strict=True)
                        },
                    )
        except sqlite3.Error as exc:
            raise StorageError(f"reading the message log failed: {exc}") from exc
        out: list[StoredMessage] = []
        rows = self._rows
        for seq in seqs:
            row = rows.get(self.index.row_of(seq))
            found = row.messages.get(seq) if row is not None else None
            if row is None or found is None:
                continue
            body = found[1]
            # Stored messages were verified before they were stored: rebuilt without
            # paying for the signature again.
            if row.batch is None:
                message = Message.trusted(orjson.loads(body), body)
            else:
                message = Message.in_batch(orjson.loads(body), body, row.batch)
            out.append(StoredMessage(seq, message))
        for key in keys:
            if key in rows:
                rows.move_to_end(key)
        while len(rows) > ROW_CACHE:
            rows.popitem(last=False)
        return out

    def _live(self, seq: int, now: int) -> bool:
        return not self.index.expired(seq, now)

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
        picked = self.matching(
            patterns, after_seq=after_seq, upto_seq=upto_seq, min_ts=min_ts, limit=limit
        )
        return await self.messages(picked)

    def matching(
        self,
        patterns: list[TopicPattern],
        *,
        after_seq: int,
        upto_seq: int,
        min_ts: int | None = None,
        limit: int = PAGE,
        now: int | None = None,
    ) -> list[int]:
        """The seqs :meth:`read_matching` reads, from the indexes alone; a message whose
        ttl ran out by ``now`` (the current time when None) is left out."""
        if after_seq >= upto_seq or not patterns:
            return []
        now, index = now_ms() if now is None else now, self.index
        picked: list[int] = []
        topics = self._topics_matching(patterns)
        if topics is not None:
            ranges = [index.topic_iter(t, after_seq, upto_seq) for t in topics]
            for seq in heapq.merge(*ranges):
                if not self._live(seq, now) or (min_ts is not None and index.ts_of(seq) < min_ts):
                    continue
                picked.append(seq)
                if len(picked) >= limit:
                    break
        else:
            for seq, topic, ts, expires in index.live(after_seq):
                if seq > upto_seq or len(picked) >= limit:
                    break
                if (
                    (expires == NO_EXPIRY or expires > now)
                    and (min_ts is None or ts >= min_ts)
                    and any(p.matches(topic) for p in patterns)
                ):
                    picked.append(seq)
        return picked

    def topic_mask(self, patterns: list[TopicPattern], mask: TopicMask | None = None) -> TopicMask:
        """By topic number, 1 where a pattern matches the topic, for
        :meth:`SeqColumns.span` where :meth:`topic_lists` gives up; given ``mask``, made
        earlier for the same patterns, the topics new since are added to it (it is made
        anew when the topics were numbered afresh meanwhile)."""
        names = self.index.topic_names
        if mask is None or mask.names is not names:
            mask = TopicMask(names, bytearray())
        bits = mask.bits
        bits.extend(any(p.matches(t) for p in patterns) for t in names[len(bits) :])
        return mask

    def topic_lists(self, patterns: list[TopicPattern]) -> list[Sequence[int]] | None:
        """The seqs of each topic in the log that the patterns match (the indexes' own
        arrays, not copies), or None when the log has too many topics to search."""
        topics = self._topics_matching(patterns)
        if topics is None:
            return None
        by_topic = self.index.by_topic
        return [by_topic[t] for t in topics if t in by_topic]

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
        # Too many topics to go through: walk back through the whole index.
        now, found = now_ms(), list[int]()
        for i, (seq, topic, _, expires) in enumerate(self.index.live_before(upto_seq + 1)):
            if len(found) >= count:
                break
            if i % SCAN_YIELD == SCAN_YIELD - 1:
                await asyncio.sleep(0)
            if (
                (expires == NO_EXPIRY or expires > now)
                and any(p.matches(topic) for p in patterns)
                and (keep is None or keep(topic))
            ):
                found.append(seq)
        return await self.messages(sorted(found))

    async def _read_last_by_topic(
        self, topics: list[str], count: int, upto_seq: int
    ) -> list[StoredMessage] | None:
        """The newest ``count`` messages of ``topics``, a topic at a time, newest topic
        first, stopping as soon as no topic left can hold one of the newest (each topic's
        head is known); None when that would take more than :data:`READ_LAST_QUERIES`
        topics."""
        heads = sorted(
            (
                (min(stats.head_seq, upto_seq), topic)
                for topic in topics
                if (stats := self.topics.get(topic)) is not None
            ),
            reverse=True,
        )
        newest: list[int] = []  # a min-heap of at most ``count`` seqs
        now = now_ms()
        for reads, (head, topic) in enumerate(heads):
            if len(newest) == count and newest[0] > head:
                break  # every message left is older than the newest ``count`` found
            if reads == READ_LAST_QUERIES:
                return None
            seqs = self.index.topic_range(topic, newest[0] if len(newest) == count else 0, upto_seq)
            taken = 0
            for seq in reversed(seqs):
                if taken == count:
                    break
                if not self._live(seq, now):
                    continue
                taken += 1
                if len(newest) < count:
                    heapq.heappush(newest, seq)
                elif seq > newest[0]:
                    heapq.heapreplace(newest, seq)
                else:
                    break  # the rest of this topic is older still
        return await self.messages(sorted(newest))

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
        now, index = now_ms(), self.index
        upto = (before_seq - 1) if before_seq is not None else 1 << 62
        seqs = index.topic_range(topic, since_seq or 0, upto)
        picked: list[int] = []
        forward = since_seq is not None or since_ts is not None
        for seq in seqs if forward else reversed(seqs):
            if not self._live(seq, now) or (since_ts is not None and index.ts_of(seq) < since_ts):
                continue
            picked.append(seq)
            if len(picked) > limit:
                break
        more = len(picked) > limit
        return await self.messages(sorted(picked[:limit])), more

    async def origin_heads(self) -> list[OriginHead]:
        """Per origin: ``(origin, floor, head, above, done)``, the gossip tracker's start
        (:meth:`LogIndex.origin_heads`): ``head`` the end of the run of origin_seqs held
        or removed by retention from 1, ``above`` the seqs held beyond a hole (bounded),
        ``done`` the runs removed above it."""
        return self.index.origin_heads()

    async def read_origin(self, origin: str, first: int, last: int, limit: int) -> list[bytes]:
        """Raw envelopes of one origin with ``first <= origin_seq <= last`` (repair); a
        batch member gets its proof."""
        seqs = self.index.origin_range(origin, first, last)[: max(0, limit)]
        by_seq = {m.seq: m for m in await self.messages(seqs)}
        return [by_seq[s].message.raw for s in seqs if s in by_seq]
