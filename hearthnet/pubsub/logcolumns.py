"""The log index's columns by ``seq`` (spec §6.3). Pure.

Every seq the log holds, ascending, with its ``ts``, ``expires_ms`` and topic number, in
parallel arrays (8 + 8 + 8 + 4 bytes a message). A deleted seq stays as a tombstone
(``ts`` :data:`DEAD`, ``expires_ms`` :data:`NO_EXPIRY`) until tombstones are half the
arrays; then they are compacted.

Retention usually deletes a prefix (the oldest messages: the message and byte caps,
each topic's count and age limits). A prefix is cut with slice assignments, at C speed:
the cut positions become tombstones and :attr:`SeqColumns.base` moves past them, so
lookups start there; compaction then slices the arrays from ``base``. Scattered deletes
(one seq at a time) and scans (which positions hold a ``ts`` or an expiry below a bound)
also stay out of Python loops per message where they can: ``min()`` over a chunk tells
whether it holds anything, and ``itertools.compress`` picks the positions.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import compress, count, islice
from operator import and_

# Both above any real time, so that min() over the arrays (C speed) tells whether a
# retention scan can find anything.
NO_EXPIRY = 1 << 62  # expires_ms of a message without ttl
DEAD = 1 << 62  # ts of a deleted seq until compaction
SCAN_CHUNK = 8192  # positions a scan looks at with one min()


class SeqColumns:
    """``seq``, ``ts``, ``expires_ms`` and topic number of every held message."""

    __slots__ = ("base", "dead", "expires", "seqs", "topic", "ts")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.ts = array("q")
        self.expires = array("q")
        self.topic = array("I")
        self.dead = 0  # tombstones, those below ``base`` included
        self.base = 0  # every position below is a tombstone (a cut prefix)

    def __len__(self) -> int:
        return len(self.seqs) - self.dead

    # --- changes ------------------------------------------------------------------

    def extend(
        self,
        seqs: Sequence[int],
        ts: Sequence[int],
        expires: Sequence[int | None],
        topic: Sequence[int] | array[int],
    ) -> None:
        """Append messages whose seqs are above every seq held, ascending."""
        self.seqs.extend(seqs)
        n = len(seqs)
        if n > 1 and type(ts) is list and ts.count(ts[0]) == n:
            # one ts for all (a group's commit): one conversion, not one per message
            self.ts.extend(array("q", ts[:1]) * n)
        else:
            self.ts.extend(ts)
        if expires.count(None) == n:
            self.expires.extend(array("q", [NO_EXPIRY]) * n)
        else:
            self.expires.extend([e or NO_EXPIRY for e in expires])
        self.topic.extend(topic)

    def append(self, seq: int, ts: int, expires: int | None, topic: int) -> None:
        """Append one message whose seq is above every seq held."""
        self.seqs.append(seq)
        self.ts.append(ts)
        self.expires.append(NO_EXPIRY if expires is None else expires)
        self.topic.append(topic)

    def insert(self, seq: int, ts: int, expires: int | None, topic: int) -> None:
        """Add one message at its place (below a cut prefix too: ``base`` moves down)."""
        pos = (
            len(self.seqs) if not self.seqs or seq > self.seqs[-1] else bisect_left(self.seqs, seq)
        )
        self.base = min(self.base, pos)
        self.seqs.insert(pos, seq)
        self.ts.insert(pos, ts)
        self.expires.insert(pos, expires or NO_EXPIRY)
        self.topic.insert(pos, topic)

    def kill(self, seq: int) -> bool:
        """Tombstone one held seq; False when it was not held."""
        pos = self.position(seq)
        if pos < len(self.seqs) and self.seqs[pos] == seq and self.ts[pos] != DEAD:
            self.ts[pos] = DEAD
            self.expires[pos] = NO_EXPIRY
            self.dead += 1
            return True
        return False

    def cut_prefix(self, before_seq: int) -> tuple[int, set[int]]:
        """Tombstone every seq below ``before_seq``: how many were held, and the topic
        numbers of the positions cut (a superset of the topics that lost messages)."""
        start, end = self.base, self.position(before_seq)
        if end <= start:
            return 0, set()
        n = end - start
        ts = self.ts
        held = n - ts[start:end].count(DEAD)
        topics = set(self.topic[start:end])
        ts[start:end] = array("q", [DEAD]) * n
        self.expires[start:end] = array("q", [NO_EXPIRY]) * n
        self.dead += held
        self.base = end
        return held, topics

    def compact(self) -> bool:
        """Drop the tombstones once they are half the arrays (a cut prefix is sliced off;
        scattered ones filtered out, at C speed); True when it did."""
        if self.dead * 2 <= len(self.seqs):
            return False
        base = self.base
        if self.dead == base:  # every tombstone is in the cut prefix
            self.seqs, self.ts = self.seqs[base:], self.ts[base:]
            self.expires, self.topic = self.expires[base:], self.topic[base:]
        else:
            keep = list(map(DEAD.__ne__, self.ts))
            self.seqs = array("q", compress(self.seqs, keep))
            self.ts = array("q", compress(self.ts, keep))
            self.expires = array("q", compress(self.expires, keep))
            self.topic = array("I", compress(self.topic, keep))
        self.dead = self.base = 0
        return True

    # --- lookups ------------------------------------------------------------------

    def position(self, seq: int) -> int:
        """Where ``seq`` is, or would be inserted."""
        return bisect_left(self.seqs, seq, self.base)

    def live(self, after_seq: int = 0) -> Iterator[tuple[int, int, int, int]]:
        """``(seq, topic number, ts, expires_ms)`` of every held seq above ``after_seq``,
        ascending (over the arrays of the moment: a compaction meanwhile does not
        disturb it)."""
        seqs, ts, expires, topic = self.seqs, self.ts, self.expires, self.topic
        for i in range(bisect_right(seqs, after_seq, self.base), len(seqs)):
            t = ts[i]
            if t != DEAD:
                yield seqs[i], topic[i], t, expires[i]

    def live_before(self, before_seq: int) -> Iterator[tuple[int, int, int, int]]:
        """As :meth:`live`, for every held seq below ``before_seq``, newest first."""
        seqs, ts, expires, topic = self.seqs, self.ts, self.expires, self.topic
        for i in range(bisect_left(seqs, before_seq, self.base) - 1, self.base - 1, -1):
            t = ts[i]
            if t != DEAD:
                yield seqs[i], topic[i], t, expires[i]

    def ts_of(self, seq: int) -> int:
        """The ``ts`` of a held seq (-1 when not held)."""
        at = self.position(seq)
        if at < len(self.seqs) and self.seqs[at] == seq and self.ts[at] != DEAD:
            return self.ts[at]
        return -1

    def expired(self, seq: int, now: int) -> bool:
        """Whether a held seq's own ttl has run out at ``now`` (True when not held)."""
        at = self.position(seq)
        if at < len(self.seqs) and self.seqs[at] == seq:
            exp = self.expires[at]
            return exp != NO_EXPIRY and exp <= now
        return True

    def after_live(self, count: int) -> int:
        """The position past the ``count`` oldest held seqs (counted a chunk at a time)."""
        pos, left, ts = self.base, count, self.ts
        if self.dead == self.base:  # no tombstone above base: positions are messages
            return min(len(ts), pos + left)
        while left > 0 and pos < len(ts):
            part = ts[pos : pos + SCAN_CHUNK]
            held = len(part) - part.count(DEAD)
            if held <= left:
                pos, left = pos + len(part), left - held
                continue
            for t in part:
                if t != DEAD:
                    left -= 1
                pos += 1
                if not left:
                    break
        return pos

    def span(
        self, topics: bytearray, after_seq: int, upto_seq: int, n: int, chunk: int = SCAN_CHUNK
    ) -> tuple[int | None, int | None]:
        """The first and the ``n``-th held seq in ``(after_seq, upto_seq]`` whose topic
        number is set in ``topics`` (each None when there are not that many)."""
        seqs, first = self.seqs, None
        for lo, picked in self._picked(topics, after_seq, upto_seq, chunk):
            found = picked.count(1)
            if not found:
                continue
            if first is None:
                first = seqs[lo + picked.index(1)]
            if found >= n:
                return first, seqs[lo + next(islice(compress(count(), picked), n - 1, None))]
            n -= found
        return first, None

    def count_of(self, topics: bytearray, after_seq: int, upto_seq: int) -> int:
        """How many held seqs in ``(after_seq, upto_seq]`` have their topic number set in
        ``topics``."""
        return sum(p.count(1) for _, p in self._picked(topics, after_seq, upto_seq, SCAN_CHUNK))

    def _picked(
        self, topics: bytearray, after_seq: int, upto_seq: int, chunk: int
    ) -> Iterator[tuple[int, bytes]]:
        """``chunk`` positions at a time from ``after_seq`` to ``upto_seq``: the first
        position, and a byte per position, 1 where it holds a seq of a topic set in
        ``topics`` (picked with ``map`` at C speed, tombstones left out)."""
        seqs, ts, number = self.seqs, self.ts, self.topic
        start = bisect_right(seqs, after_seq, self.base)
        end = bisect_right(seqs, upto_seq, self.base)
        tombstones = self.dead != self.base  # some above base: positions are not all held
        for lo in range(start, end, chunk):
            hi = min(end, lo + chunk)
            picked = bytes(map(topics.__getitem__, number[lo:hi]))
            if tombstones:
                picked = bytes(map(and_, picked, map(DEAD.__ne__, ts[lo:hi])))
            yield lo, picked

    def below(
        self, column: array[int], bound: int, limit: int, topics: bytearray | None = None
    ) -> list[int]:
        """Positions (ascending, at most ``limit``) whose value in ``column`` (:attr:`ts`
        or :attr:`expires`) is below ``bound`` (tombstones never are), and, with
        ``topics``, whose topic number is set there."""
        out: list[int] = []
        number_at = self.topic.__getitem__
        for start in range(self.base, len(column), SCAN_CHUNK):
            part = column[start : start + SCAN_CHUNK]
            if min(part) >= bound:
                continue
            found = list(compress(range(start, start + len(part)), map(bound.__gt__, part)))
            if topics is not None:
                found = list(compress(found, map(topics.__getitem__, map(number_at, found))))
            out += found
            if len(out) >= limit:
                return out[:limit]
        return out
