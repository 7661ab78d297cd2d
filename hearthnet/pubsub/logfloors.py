"""What retention removed of each origin, kept across restarts (spec §7.3).

An ``ihave`` tells peers, per origin, a floor: nothing below it is to be had from this
node, and a peer behind it skips the hole (``OriginTracker.skip_to``). That must mean
"retention removed it", never "it never came here": a node that got an origin's message
2 live, while 1 was still to come by anti-entropy, and restarted must not say "nothing
below 2". So the floor a node starts with is not the lowest origin_seq it holds but
comes from the ``origin_floors`` table: per origin, the highest origin_seq retention
removed, written in retention's own transactions, and the highest gossip skipped on a
peer's floor (retention removed it on the mesh: ``MessageLog.delete(elsewhere=...)``)
(:func:`~hearthnet.pubsub.logindex.origin_start` turns it into the floor and head).

What it cannot tell: a hole below a seq retention removed here (message 1 never came, 3
was removed) counts as removed too.

A log made before the table existed is seeded once, when it opens, from the lowest
origin_seq held per origin (what its floors meant then): a hole below it at that moment
is taken for retention, as before.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable

from hearthnet.pubsub.logindex import LogIndex, lowest_held

TABLE = """
CREATE TABLE IF NOT EXISTS origin_floors (
    origin TEXT PRIMARY KEY,
    removed INTEGER NOT NULL
)
"""
SEEDED = "origin_floors"  # the meta key set once the table is in use

UPSERT = (
    "INSERT INTO origin_floors (origin, removed) VALUES (?, ?) ON CONFLICT(origin)"
    " DO UPDATE SET removed = max(removed, excluded.removed)"
)


def highest(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The highest origin_seq per origin of ``(origin, origin_seq)`` pairs."""
    out: dict[str, int] = {}
    for origin, origin_seq in pairs:
        if origin_seq > out.get(origin, 0):
            out[origin] = origin_seq
    return out


def save_removed(conn: sqlite3.Connection, removed: dict[str, int]) -> None:
    """Record, inside the caller's transaction, that retention removed up to these
    origin_seqs (a stored value only grows)."""
    if removed:
        conn.executemany(UPSERT, list(removed.items()))


def merge(index: LogIndex, removed: dict[str, int]) -> None:
    """The index's mirror of the table, after the transaction that saved ``removed``."""
    mine = index.removed
    for origin, origin_seq in removed.items():
        if origin_seq > mine.get(origin, 0):
            mine[origin] = origin_seq


def load_removed(conn: sqlite3.Connection, index: LogIndex) -> None:
    """Read the table into ``index.removed`` (writer thread, at open, after the rows are
    indexed); a log from before the table is seeded first (see the module's docstring)."""
    conn.execute(TABLE)
    if conn.execute("SELECT 1 FROM meta WHERE key = ?", (SEEDED,)).fetchone() is None:
        seed = {o: low - 1 for o, low in lowest_held(index).items() if low > 1}
        conn.execute("BEGIN IMMEDIATE")
        try:
            save_removed(conn, seed)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, '1')", (SEEDED,))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
    index.removed = dict(conn.execute("SELECT origin, removed FROM origin_floors"))
