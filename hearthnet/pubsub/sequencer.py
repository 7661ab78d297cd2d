"""Numbering of the node's log (spec §6.3, §6.4): ``seq``, ``origin_seq``, dedupe by id,
topic stats. Pure: no I/O, no clock, no threads.

The log asks :meth:`Sequencer.number` for the seqs of a batch before its commit (which
leaves the state untouched: a commit that fails hands nothing out) and tells
:meth:`Sequencer.committed` what was stored once the commit is durable. ``seq`` is dense
across the log (every committed message takes the next one, duplicates take none) and
so strictly increasing per topic; a restart rebuilds the sequencer from what the log
holds (:meth:`Sequencer.restore`) and numbers on from its head.

The dedupe window is every id the log holds (bounded by retention, which calls
:meth:`Sequencer.forget`); about 105 bytes a message (a 26-character ULID in a set).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


@dataclass(slots=True)
class TopicStats:
    """What the log holds of one topic (kept in memory, exact)."""

    messages: int = 0
    bytes: int = 0
    head_seq: int = 0
    last_ts: int = 0


class Counted(Protocol):
    """What the sequencer reads of a committed message (the log's row headers)."""

    @property
    def seq(self) -> int: ...
    @property
    def id(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def ts(self) -> int: ...


class Entry(NamedTuple):
    """One committed message as the sequencer counts it."""

    seq: int
    id: str
    topic: str
    size: int
    ts: int


class Sequencer:
    """``seq`` and ``origin_seq`` counters, the ids held, and per-topic stats."""

    __slots__ = ("head_seq", "ids", "origin_seq", "topics", "total_bytes")

    def __init__(self, head_seq: int = 0, origin_seq: int = 0) -> None:
        self.head_seq = head_seq
        self.origin_seq = origin_seq
        self.ids: set[str] = set()
        self.topics: dict[str, TopicStats] = {}
        self.total_bytes = 0

    @classmethod
    def restore(cls, head_seq: int, origin_seq: int, held: Iterable[Counted]) -> Sequencer:
        """The sequencer of a log that holds ``held``, whose highest ``seq`` ever handed
        out is at least ``head_seq``."""
        out = cls(0, origin_seq)
        out.committed(list(held))
        out.head_seq = max(out.head_seq, head_seq)
        return out

    def next_origin_seq(self) -> int:
        """Number a local publish (never reused, even when its commit fails)."""
        self.origin_seq += 1
        return self.origin_seq

    def knows(self, message_id: str) -> bool:
        """Whether the log holds this id."""
        return message_id in self.ids

    def number(self, items: Sequence[tuple[str, bool] | None]) -> list[int | None]:
        """The seq each ``(id, local)`` of a batch would take, in order: None for a peer's
        message the log holds or that came earlier in the same batch (a local publish is
        new by construction), and for a None item (a publish refused before its commit).
        Changes nothing."""
        seq, seen, out = self.head_seq, set[str](), list[int | None]()
        ids = self.ids
        for item in items:
            if item is None:
                out.append(None)
                continue
            message_id, local = item
            if not local and (message_id in ids or message_id in seen):
                out.append(None)
                continue
            seen.add(message_id)
            seq += 1
            out.append(seq)
        return out

    def committed(self, entries: Sequence[Counted]) -> None:
        """What a commit stored: new ids, in seq order, each seq above every seq held."""
        if entries:
            self.committed_columns(
                [e.seq for e in entries],
                [e.id for e in entries],
                [e.topic for e in entries],
                [e.size for e in entries],
                [e.ts for e in entries],
            )

    def committed_columns(
        self,
        seqs: Sequence[int],
        ids: Sequence[str],
        topics: Sequence[str],
        sizes: Sequence[int],
        ts: Sequence[int],
    ) -> None:
        """:meth:`committed` given as columns (one entry per position): a commit of one
        topic (a token stream, one publisher's batch) is counted without a loop per
        message."""
        n = len(seqs)
        if n == 1:  # a lone publish's commit (one in flight)
            self._committed_one(seqs[0], ids[0], topics[0], sizes[0], ts[0])
            return
        if not n:
            return
        self.ids.update(ids)
        total = sum(sizes)
        self.total_bytes += total
        self.head_seq = max(self.head_seq, seqs[-1])
        topics_held = self.topics
        topic = topics[0]
        if topics.count(topic) == n:
            stats = topics_held.get(topic)
            if stats is None:
                stats = topics_held[topic] = TopicStats()
            stats.messages += n
            stats.bytes += total
            stats.head_seq = seqs[-1]
            stats.last_ts = max(stats.last_ts, *ts)
            return
        topic, stats = "", TopicStats()
        for i in range(n):
            if topics[i] != topic:
                topic = topics[i]
                found = topics_held.get(topic)
                if found is None:
                    found = topics_held[topic] = TopicStats()
                stats = found
            stats.messages += 1
            stats.bytes += sizes[i]
            stats.head_seq = seqs[i]  # seq order, above every seq held
            if ts[i] > stats.last_ts:  # noqa: PLR1730 - a call to max() costs more
                stats.last_ts = ts[i]

    def _committed_one(self, seq: int, message_id: str, topic: str, size: int, ts: int) -> None:
        """:meth:`committed_columns` of one message."""
        self.ids.add(message_id)
        self.total_bytes += size
        if seq > self.head_seq:  # noqa: PLR1730 - a call to max() costs more
            self.head_seq = seq
        stats = self.topics.get(topic)
        if stats is None:
            stats = self.topics[topic] = TopicStats()
        stats.messages += 1
        stats.bytes += size
        stats.head_seq = seq
        if ts > stats.last_ts:  # noqa: PLR1730
            stats.last_ts = ts

    def forget(self, entries: Iterable[Counted]) -> None:
        """Messages retention deleted: their ids may come again (as new messages); the
        counters never go back."""
        held = [e for e in entries if e.id in self.ids]
        self.forget_columns([e.id for e in held], [e.topic for e in held], [e.size for e in held])

    def forget_columns(
        self, ids: Sequence[str], topics: Sequence[str], sizes: Sequence[int]
    ) -> None:
        """:meth:`forget` given as columns of messages the log held (one entry per
        position, each id once): ids and counts dropped at C speed."""
        if not ids:
            return
        self.ids.difference_update(ids)
        self.total_bytes -= sum(sizes)
        counts = Counter(topics)
        if len(counts) == 1:
            freed = {topics[0]: sum(sizes)}
        else:
            freed = dict.fromkeys(counts, 0)
            for topic, size in zip(topics, sizes, strict=True):
                freed[topic] += size
        held = self.topics
        for topic, n in counts.items():
            stats = held.get(topic)
            if stats is not None:
                stats.messages -= n
                stats.bytes -= freed[topic]
                if stats.messages <= 0:
                    del held[topic]
