"""The log's per-message indexes, in memory (spec §6.3). Pure.

The log stores one SQLite row per committed batch (:mod:`hearthnet.pubsub.logstore`);
what reads look up per message is kept here and rebuilt from the rows' headers when the
log opens:

- by ``seq``: which row holds it (row keys, ascending), its ``ts``, ``expires_ms`` and
  topic (:class:`~hearthnet.pubsub.logcolumns.SeqColumns`: parallel arrays over every held
  seq, ascending, with tombstones and a cut prefix);
- by topic: each topic's seqs, ascending (history, catch-up, ``{last: N}``, retention
  by count);
- by origin: each origin's ``origin_seq`` values, ascending, with their seqs (gossip
  repair and the anti-entropy heads).

Retention deletes in two ways: :meth:`LogIndex.cut_prefix` drops every seq below a bound
(the oldest messages: slices of each array, no work per message in Python), and
:meth:`LogIndex.remove` drops scattered ones (a bisection each, each touched topic's and
origin's arrays cut once).

Ids (dedupe, ``knows``) are the sequencer's (:mod:`hearthnet.pubsub.sequencer`).
Memory: about 60 bytes a message here (8-byte array slots: seq, ts, expires, the topic's
and the origin's seq lists, origin_seq; 4 for the topic number), plus the row keys.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, filterfalse
from operator import lt
from typing import Any, NamedTuple

from hearthnet.pubsub.floorruns import Removed, Run, Start, start
from hearthnet.pubsub.logcolumns import NO_EXPIRY, SeqColumns

__all__ = [
    "NO_EXPIRY",
    "Head",
    "LogIndex",
    "OriginHead",
    "lowest_held",
    "origin_seqs",
    "origin_start",
]

NOTHING = Removed(0)  # an origin retention removed nothing of
# Numbers of topics no longer held are kept until there are more than this many topic
# numbers and at least half of them name topics gone; the held ones are then numbered
# afresh (so a node that sees many short-lived topics does not keep their names for ever).
TOPIC_NUMBERS_SPARE = 4096


class Head(NamedTuple):
    """One message's header as a row stores it (and the index keeps of it)."""

    seq: int
    id: str
    topic: str
    origin: str
    origin_seq: int
    ts: int
    expires_ms: int | None
    size: int


def _int64s(values: Sequence[int]) -> array[int]:
    """``array("q", values)``; a range (a commit's seqs) packed by ``struct``, whose
    conversion of each int costs about half the array's."""
    if type(values) is range and values:
        return array("q", struct.pack(f"{len(values)}q", *values))
    return array("q", values)


class OriginHead(NamedTuple):
    """One origin's gossip start (:meth:`LogIndex.origin_heads`)."""

    origin: str
    floor: int
    head: int
    above: list[int]
    done: list[Run]


class LogIndex:
    """Seq, topic and origin indexes over the messages the log holds."""

    def __init__(self) -> None:
        self.rows = array("q")  # row keys (the seq of each row's first message), ascending
        self.cols = SeqColumns()
        # by topic number (SeqColumns.topic); a new list when the held topics are
        # numbered afresh (:func:`_compact`)
        self.topic_names: list[str] = []
        self.topic_numbers: dict[str, int] = {}  # the other way
        self.by_topic: dict[str, array[int]] = {}
        # Per origin: its origin_seqs ascending, and their seqs (ascending too, unless
        # the origin is in ``_unsorted``: a message repaired into a hole came late).
        self._origins: dict[str, tuple[array[int], array[int]]] = {}
        self._unsorted: set[str] = set()
        # Per origin: what retention removed here, as a bound and the holes below it
        # (kept in the log's ``origin_floors`` table; :mod:`hearthnet.pubsub.logfloors`)
        self.removed: dict[str, Removed] = {}

    def __len__(self) -> int:
        return len(self.cols)

    # --- changes ------------------------------------------------------------------

    def add_row(self, key: int, heads: Iterable[Head]) -> None:
        """A row committed (or read at open), its messages in seq order; rows come in
        key order."""
        if not self.rows or key > self.rows[-1]:
            self.rows.append(key)
        else:
            self.rows.insert(bisect_left(self.rows, key), key)
        heads = list(heads)
        seqs = self.cols.seqs
        if heads and (not seqs or heads[0].seq > seqs[-1]):
            if not self._append_run(*zip(*heads, strict=True)):
                self._append(heads)
            return
        for head in heads:
            self._add(head)

    def add_columns(self, key: int, cols: Sequence[Sequence[Any]]) -> None:
        """:meth:`add_row` of a row whose headers are given as columns, in :class:`Head`'s
        order (a commit's row of one batch: added without a :class:`Head` per message)."""
        seqs = cols[0]
        rows = self.rows
        if (
            len(seqs) == 1  # a lone publish's commit (one in flight)
            and (not self.cols.seqs or seqs[0] > self.cols.seqs[-1])
            and (not rows or key > rows[-1])
            and self._append_one(*cols)
        ):
            rows.append(key)
            return
        if (
            seqs
            and (not self.cols.seqs or seqs[0] > self.cols.seqs[-1])
            and (not rows or key > rows[-1])
            and self._append_run(*cols)
        ):
            rows.append(key)
            return
        self.add_row(key, list(map(Head._make, zip(*cols, strict=True))))

    def _append_one(  # noqa: PLR0917 - the columns of Head, in its order
        self,
        seqs: Sequence[int],
        _ids: Sequence[str],
        topics: Sequence[str],
        origins: Sequence[str],
        origin_seqs: Sequence[int],
        ts: Sequence[int],
        expires: Sequence[int | None],
        _sizes: Sequence[int],
    ) -> bool:
        """:meth:`_append_run` of one message (columns of one), without the run's checks
        and copies. False (nothing changed): its ``origin_seq`` is not above its
        origin's."""
        seq, origin, origin_seq, topic = seqs[0], origins[0], origin_seqs[0], topics[0]
        entry = self._origins.get(origin)
        if entry is None:
            entry = self._origins[origin] = (array("q"), array("q"))
        elif entry[0] and origin_seq <= entry[0][-1]:
            return False
        entry[0].append(origin_seq)
        entry[1].append(seq)
        topic_seqs = self.by_topic.get(topic)
        if topic_seqs is None:
            topic_seqs = self.by_topic[topic] = array("q")
        topic_seqs.append(seq)
        self.cols.append(seq, ts[0], expires[0], self._topic_id(topic))
        return True

    def _append_run(  # noqa: PLR0917 - the columns of Head, in its order
        self,
        seqs: Sequence[int],
        _ids: Sequence[str],
        topics: Sequence[str],
        origins: Sequence[str],
        origin_seqs: Sequence[int],
        ts: Sequence[int],
        expires: Sequence[int | None],
        _sizes: Sequence[int],
    ) -> bool:
        """:meth:`_append` of a run of one topic and one origin with consecutive
        ``origin_seq`` above that origin's (one publisher's batch), given as the columns
        of its headers: added without a loop per message. False (nothing changed): not
        such a run."""
        n = len(seqs)
        topic, origin, first = topics[0], origins[0], origin_seqs[0]
        if (
            topics.count(topic) != n
            or origins.count(origin) != n
            or origin_seqs[-1] != first + n - 1
            or (
                origin_seqs != range(first, first + n)  # a commit's run: ranges compared
                and list(origin_seqs) != list(range(first, first + n))
            )
        ):
            return False
        entry = self._origins.get(origin)
        if entry is not None and entry[0] and first <= entry[0][-1]:
            return False
        if entry is None:
            entry = self._origins[origin] = (array("q"), array("q"))
        # the seqs once as an array: each array below then takes them as one copy (an
        # array extended by a range or a list converts every element)
        held = _int64s(seqs)
        entry[0].extend(_int64s(origin_seqs))
        entry[1].extend(held)
        topic_id = self._topic_id(topic)
        topic_seqs = self.by_topic.get(topic)
        if topic_seqs is None:
            topic_seqs = self.by_topic[topic] = array("q")
        topic_seqs.extend(held)
        self.cols.extend(held, ts, expires, array("I", [topic_id]) * n)
        return True

    def _topic_id(self, topic: str) -> int:
        found = self.topic_numbers.get(topic)
        if found is None:
            found = self.topic_numbers[topic] = len(self.topic_names)
            self.topic_names.append(topic)
        return found

    def _append(self, heads: list[Head]) -> None:
        """The usual case: every seq above those held (a new commit). A run of one
        topic or one origin (a token stream, our own batch) is looked up once."""
        topic_ids, by_topic, origins = self.topic_numbers, self.by_topic, self._origins
        topic_numbers = []
        topic, topic_id, topic_seqs = "", 0, array("q")
        origin, oseqs, oseq_seqs = "", array("q"), array("q")
        for head in heads:
            if head.topic != topic:
                topic = head.topic
                found = topic_ids.get(topic)
                if found is None:
                    found = self._topic_id(topic)
                seqs = by_topic.get(topic)
                if seqs is None:
                    seqs = by_topic[topic] = array("q")
                topic_id, topic_seqs = found, seqs
            topic_numbers.append(topic_id)
            topic_seqs.append(head.seq)
            if head.origin != origin:
                origin = head.origin
                entry = origins.get(origin)
                if entry is None:
                    entry = origins[origin] = (array("q"), array("q"))
                oseqs, oseq_seqs = entry
            if not oseqs or head.origin_seq > oseqs[-1]:
                oseqs.append(head.origin_seq)
                oseq_seqs.append(head.seq)
            else:
                at = bisect_left(oseqs, head.origin_seq)
                oseqs.insert(at, head.origin_seq)
                oseq_seqs.insert(at, head.seq)
                self._unsorted.add(origin)  # a seq above all before lower ones
        self.cols.extend(
            [h.seq for h in heads],
            [h.ts for h in heads],
            [h.expires_ms for h in heads],
            topic_numbers,
        )

    def _add(self, head: Head) -> None:
        seq = head.seq
        self.cols.insert(seq, head.ts, head.expires_ms, self._topic_id(head.topic))
        _insert(self.by_topic.setdefault(head.topic, array("q")), seq)
        oseqs, seqs = self._origins.setdefault(head.origin, (array("q"), array("q")))
        if not oseqs or head.origin_seq > oseqs[-1]:
            at = len(oseqs)
        else:
            at = bisect_left(oseqs, head.origin_seq)
        if (at and seqs[at - 1] > seq) or (at < len(seqs) and seqs[at] < seq):
            self._unsorted.add(head.origin)
        oseqs.insert(at, head.origin_seq)
        seqs.insert(at, seq)

    def remove(self, heads: Iterable[Head], rows_gone: Iterable[int]) -> None:
        """Messages deleted (retention), and the rows left without any."""
        by_topic: dict[str, list[int]] = {}
        by_origin: dict[str, list[tuple[int, int]]] = {}
        cols = self.cols
        for head in heads:
            cols.kill(head.seq)
            by_topic.setdefault(head.topic, []).append(head.seq)
            by_origin.setdefault(head.origin, []).append((head.origin_seq, head.seq))
        # Positions found by bisection, the arrays cut around them: O(size) of memory
        # copied per topic or origin touched, not a Python loop over every entry.
        for topic, dead in by_topic.items():
            seqs = self.by_topic.get(topic)
            if seqs is None:
                continue
            found = {p for s in dead if (p := bisect_left(seqs, s)) < len(seqs) and seqs[p] == s}
            kept = _without(seqs, found)
            if kept:
                self.by_topic[topic] = kept
            else:
                del self.by_topic[topic]
        for origin, pairs in by_origin.items():
            entry = self._origins.get(origin)
            if entry is None:
                continue
            oseqs, oseq_seqs = entry
            at: set[int] = set()
            for oseq, seq in pairs:
                for p in range(bisect_left(oseqs, oseq), bisect_right(oseqs, oseq)):
                    if oseq_seqs[p] == seq:
                        at.add(p)
            if len(at) < len(oseqs):
                self._origins[origin] = (_without(oseqs, at), _without(oseq_seqs, at))
            else:
                del self._origins[origin]
                self._unsorted.discard(origin)
        self.rows = _rows_without(self.rows, rows_gone)
        _compact(self)

    def cut_prefix(self, before_seq: int, rows_gone: Sequence[int]) -> int:
        """Every message with a seq below ``before_seq`` deleted (retention's oldest
        first), and the rows left without any (ascending); returns how many were held.
        Each array is sliced once: no work per message in Python."""
        held, topic_numbers = self.cols.cut_prefix(before_seq)
        names, by_topic = self.topic_names, self.by_topic
        for number in topic_numbers:
            topic = names[number]
            seqs = by_topic.get(topic)
            if seqs is None or seqs[0] >= before_seq:
                continue
            k = bisect_left(seqs, before_seq)
            if k < len(seqs):
                by_topic[topic] = seqs[k:]  # a new array: a catch-up may iterate the old
            else:
                del by_topic[topic]
        for origin, (held_oseqs, held_seqs) in list(self._origins.items()):
            if origin in self._unsorted:
                keep = list(map(before_seq.__le__, held_seqs))
                if all(keep):
                    continue
                oseqs = array("q", compress(held_oseqs, keep))
                seqs = array("q", compress(held_seqs, keep))
                if all(map(lt, seqs, seqs[1:])):
                    self._unsorted.discard(origin)  # what came late is gone
            else:
                if not held_seqs or held_seqs[0] >= before_seq:
                    continue
                k = bisect_left(held_seqs, before_seq)
                oseqs, seqs = held_oseqs[k:], held_seqs[k:]
            if seqs:
                self._origins[origin] = (oseqs, seqs)
            else:
                del self._origins[origin]
                self._unsorted.discard(origin)
        self.rows = _rows_without(self.rows, rows_gone)
        _compact(self)
        return held

    # --- lookups ------------------------------------------------------------------

    def row_of(self, seq: int) -> int:
        """The key of the row that holds (or held) ``seq``."""
        at = bisect_right(self.rows, seq) - 1
        return self.rows[at] if at >= 0 else 0

    def live(self, after_seq: int = 0) -> Iterator[tuple[int, str, int, int]]:
        """``(seq, topic, ts, expires_ms)`` of every held message with
        ``seq > after_seq``, ascending (:data:`NO_EXPIRY` without ttl)."""
        names = self.topic_names
        for seq, topic, ts, expires in self.cols.live(after_seq):
            yield seq, names[topic], ts, expires

    def live_before(self, before_seq: int) -> Iterator[tuple[int, str, int, int]]:
        """As :meth:`live`, for every held seq below ``before_seq``, newest first."""
        names = self.topic_names
        for seq, topic, ts, expires in self.cols.live_before(before_seq):
            yield seq, names[topic], ts, expires

    def ts_of(self, seq: int) -> int:
        """The ``ts`` of a held seq (-1 when not held)."""
        return self.cols.ts_of(seq)

    def expired(self, seq: int, now: int) -> bool:
        """Whether a held seq's own ttl has run out at ``now``."""
        return self.cols.expired(seq, now)

    def topic_range(self, topic: str, after_seq: int, upto_seq: int) -> array[int]:
        """The topic's seqs with ``after_seq < seq <= upto_seq``, ascending."""
        seqs = self.by_topic.get(topic)
        if not seqs:
            return array("q")
        return seqs[bisect_right(seqs, after_seq) : bisect_right(seqs, upto_seq)]

    def topic_iter(self, topic: str, after_seq: int, upto_seq: int) -> Iterator[int]:
        """As :meth:`topic_range`, lazily (no copy: catch-up merges many topics and
        stops at a page)."""
        seqs = self.by_topic.get(topic)
        if not seqs:
            return iter(())
        lo, hi = bisect_right(seqs, after_seq), bisect_right(seqs, upto_seq)
        return map(seqs.__getitem__, range(lo, hi))

    def origin_range(self, origin: str, first: int, last: int) -> list[int]:
        """Seqs of one origin's messages with ``first <= origin_seq <= last``, in
        ``origin_seq`` order."""
        entry = self._origins.get(origin)
        if entry is None:
            return []
        oseqs, seqs = entry
        return list(seqs[bisect_left(oseqs, first) : bisect_right(oseqs, last)])

    def origin_heads(self, above_max: int = 100_000) -> list[OriginHead]:
        """Per origin: ``(origin, floor, head, above, done)`` (:func:`origin_start` of its
        origin_seqs held and :attr:`removed`), at most ``above_max`` seqs above in all."""
        out: list[OriginHead] = []
        budget = above_max
        gone = [o for o in self.removed if o not in self._origins]  # nothing held
        for origin in [*self._origins, *gone]:
            floor, head, above, done = origin_start(
                origin_seqs(self, origin), self.removed.get(origin, NOTHING), budget
            )
            budget -= len(above)
            out.append(OriginHead(origin, floor, head, above, done))
        return out


def origin_seqs(index: LogIndex, origin: str) -> Sequence[int]:
    """One origin's origin_seqs held, ascending (the index's own array: not to be
    changed; the writer thread reads it in retention's transactions)."""
    entry = index._origins.get(origin)
    return entry[0] if entry is not None else ()


def lowest_held(index: LogIndex) -> dict[str, int]:
    """Per origin held, its lowest origin_seq."""
    return {origin: oseqs[0] for origin, (oseqs, _) in index._origins.items()}


def origin_start(held: Sequence[int], removed: Removed, above_max: int) -> Start:
    """An origin's gossip start from what the log holds of it: ``(floor, head, above,
    done)`` (:func:`hearthnet.pubsub.floorruns.start`).

    ``held`` is its origin_seqs held, ascending; ``removed`` what retention removed here
    (a bound, and the holes below it that never came). Everything up to the bound but
    the holes counts as done (held, or gone by retention), and the head runs on through
    what is held. The floor, "no seq below it to be had from us", never rises over a
    hole: a node holding 2.. that removed nothing says 1, not 2, and one that never had
    5 and removed 1..8 says 5, not 9 (a peer told "nothing below 9" would skip 5 for
    good, though another peer holds it).
    """
    return start(held, removed, above_max)


def _compact(index: LogIndex) -> None:
    """Compact the seq columns (:meth:`SeqColumns.compact`); after a compaction, when
    most topic numbers name topics no longer held (past :data:`TOPIC_NUMBERS_SPARE`),
    number the held ones afresh, in their old order. The names and the columns' topic
    array are new objects, so a walk that took the old ones (:meth:`LogIndex.live`)
    goes on reading them consistently."""
    cols, names = index.cols, index.topic_names
    if not cols.compact() or len(names) <= max(TOPIC_NUMBERS_SPARE, 2 * len(index.by_topic)):
        return
    held = sorted(set(cols.topic))  # no tombstone after a compaction: every position is held
    renumber = array("I", [0]) * len(names)
    for new, old in enumerate(held):
        renumber[old] = new
    cols.topic = array("I", map(renumber.__getitem__, cols.topic))
    index.topic_names = [names[n] for n in held]
    index.topic_numbers = {t: n for n, t in enumerate(index.topic_names)}


def _insert(seqs: array[int], seq: int) -> None:
    """Insert into an ascending array (appending in the usual case)."""
    if not seqs or seq > seqs[-1]:
        seqs.append(seq)
    else:
        seqs.insert(bisect_left(seqs, seq), seq)


def _without(values: array[int], positions: set[int]) -> array[int]:
    """``values`` without the entries at ``positions`` (slices copied between them)."""
    out = array(values.typecode)
    prev = 0
    for pos in sorted(positions):
        out += values[prev:pos]
        prev = pos + 1
    out += values[prev:]
    return out


def _rows_without(rows: array[int], keys: Iterable[int]) -> array[int]:
    """``rows`` without ``keys`` (ascending): a prefix in one slice, else by one filter."""
    keys = list(keys)
    if not keys:
        return rows
    k = bisect_right(rows, keys[-1])
    if k == len(keys) and rows[:k] == array("q", keys):
        return rows[k:]
    gone = set(keys)
    return array("q", filterfalse(gone.__contains__, rows))
