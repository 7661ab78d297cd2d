"""What retention removed of each origin, kept across restarts (spec §7.3).

An ``ihave`` tells peers, per origin, a floor: nothing below it is to be had from this
node, and a peer behind it skips the hole (``OriginTracker.skip_to``). That must mean
"retention removed it", never "it never came here": a node that got an origin's message
2 live, while 1 was still to come by anti-entropy, and restarted must not say "nothing
below 2"; nor may one that never had 5 and whose retention removed 1..8 say "nothing
below 9" (a peer that missed 5 would skip it though another peer holds it). So the floor
a node starts with is not the lowest origin_seq it holds but comes from the
``origin_floors`` table: per origin, a bound and the holes below it
(:mod:`hearthnet.pubsub.floorruns`): every seq up to the bound was held here or skipped
on a peer's floor, but the holes, runs that never came. It is written in retention's own
transactions: the bound rises to the highest origin_seq removed, and the seqs between
the old bound and the new that the log never held (read from the index's origin arrays,
which still hold what the transaction removes) become holes; a hole filled later and
then removed leaves the list. Gossip skipping on a peer's floor
(``MessageLog.delete(elsewhere=...)``) raises the bound over everything below the floor,
holes included. :func:`~hearthnet.pubsub.logindex.origin_start` turns it into the floor,
head, and the removed runs above the head. At most
:data:`~hearthnet.pubsub.floorruns.MAX_HOLES` holes an origin: past them the bound comes
down (what was removed above is asked of the mesh again; nothing is counted removed that
was not).

What it still cannot tell: a hole in a log from before the holes were kept (see below),
and one hidden by an origin that numbered two messages alike (the holes are found by
bisecting the held origin_seqs, which takes them for distinct).

A log made before the table existed is seeded once, when it opens, from the lowest
origin_seq held per origin (what its floors meant then): a hole below it at that moment
is taken for retention, as before. A table from before the holes gets its ``holes``
column when the log opens (its bounds keep their meaning: no holes known below them).
"""

from __future__ import annotations

import contextlib
import sqlite3
from bisect import bisect_right
from collections.abc import Iterable, Mapping

import orjson

from hearthnet.pubsub.floorruns import Removed, after_removal, after_skip
from hearthnet.pubsub.logindex import NOTHING, LogIndex, lowest_held, origin_seqs

TABLE = """
CREATE TABLE IF NOT EXISTS origin_floors (
    origin TEXT PRIMARY KEY,
    removed INTEGER NOT NULL,
    holes TEXT
)
"""
SEEDED = "origin_floors"  # the meta key set once the table is in use

UPSERT = (
    "INSERT INTO origin_floors (origin, removed, holes) VALUES (?, ?, ?) ON CONFLICT(origin)"
    " DO UPDATE SET removed = excluded.removed, holes = excluded.holes"
)


def by_origin(pairs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """The origin_seqs per origin of ``(origin, origin_seq)`` pairs."""
    out: dict[str, list[int]] = {}
    for origin, origin_seq in pairs:
        seqs = out.get(origin)
        if seqs is None:
            out[origin] = [origin_seq]
        else:
            seqs.append(origin_seq)
    return out


def removal(index: LogIndex, gone: Mapping[str, list[int]]) -> dict[str, Removed]:
    """The records of the origins retention removed ``gone`` of (per origin, its
    origin_seqs), from the index's as it is before the removal (writer thread, in the
    transaction that removes them: see the module's docstring)."""
    out: dict[str, Removed] = {}
    mine = index.removed
    for origin, seqs in gone.items():
        seqs.sort()
        was = mine.get(origin, NOTHING)
        held = origin_seqs(index, origin)
        # a copy of the part looked at, taken in one step: the event loop may insert a
        # repaired seq meanwhile (a window of the array as it was then, or one place off
        # at an end, only ever shows fewer seqs held: more holes, never fewer)
        window = held[bisect_right(held, was.upto) : bisect_right(held, seqs[-1]) + 1]
        now = after_removal(was, seqs, window)
        if now != was:
            out[origin] = now
    return out


def skips(index: LogIndex, elsewhere: Mapping[str, int]) -> dict[str, Removed]:
    """The records once gossip skipped, per origin, everything up to these origin_seqs."""
    mine = index.removed
    return {o: after_skip(mine.get(o, NOTHING), upto) for o, upto in elsewhere.items()}


def save_removed(conn: sqlite3.Connection, records: Mapping[str, Removed]) -> None:
    """Write ``records`` (from :func:`removal` or :func:`skips`) inside the caller's
    transaction."""
    if records:
        conn.executemany(
            UPSERT,
            [
                (o, r.upto, orjson.dumps(r.holes).decode() if r.holes else None)
                for o, r in records.items()
            ],
        )


def merge(index: LogIndex, records: Mapping[str, Removed]) -> None:
    """The index's mirror of the table, after the transaction that saved ``records``."""
    index.removed.update(records)


def _holes(text: str | None) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in orjson.loads(text)) if text else ()


def load_removed(conn: sqlite3.Connection, index: LogIndex) -> None:
    """Read the table into ``index.removed`` (writer thread, at open, after the rows are
    indexed); a log from before the table is seeded first, a table from before the
    holes gets their column (see the module's docstring)."""
    conn.execute(TABLE)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(origin_floors)")}
    if "holes" not in columns:
        conn.execute("ALTER TABLE origin_floors ADD COLUMN holes TEXT")
    if conn.execute("SELECT 1 FROM meta WHERE key = ?", (SEEDED,)).fetchone() is None:
        seed = {o: Removed(low - 1) for o, low in lowest_held(index).items() if low > 1}
        conn.execute("BEGIN IMMEDIATE")
        try:
            save_removed(conn, seed)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, '1')", (SEEDED,))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
    index.removed = {
        origin: Removed(upto, _holes(holes))
        for origin, upto, holes in conn.execute("SELECT origin, removed, holes FROM origin_floors")
    }
