"""A durable consumer's stored state (spec §6.8) and how it is written with a commit."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import orjson

from hearthnet.clock import now_ms


@dataclass(slots=True)
class ConsumerRecord:
    """A durable consumer's stored state (spec §6.8)."""

    identity: str
    name: str
    patterns: tuple[str, ...]
    cursor: int
    lost: tuple[int, int] | None = None
    dirty: bool = field(default=False, compare=False)
    deleted: bool = field(default=False, compare=False)  # its row goes with the next write


ConsumerState = tuple[tuple[str, ...], int, tuple[int, int] | None, bool]


def consumer_state(record: ConsumerRecord) -> ConsumerState:
    """What of a consumer is stored: patterns, cursor, lost range, and whether it is
    deleted."""
    return (record.patterns, record.cursor, record.lost, record.deleted)


def dirty_consumers(
    consumers: dict[tuple[str, str], ConsumerRecord],
) -> list[tuple[ConsumerRecord, ConsumerState]]:
    """Snapshots of the changed consumers, for the writer thread (what it writes must not
    change under it)."""
    return [(c, consumer_state(c)) for c in consumers.values() if c.dirty]


def mark_clean(
    written: list[tuple[ConsumerRecord, ConsumerState]],
    changed: dict[tuple[str, str], ConsumerRecord],
) -> None:
    """After the commit: a consumer is clean unless it changed while it was being written
    (then it stays dirty and goes with the next commit); the clean ones leave ``changed``
    (the consumers the next commit looks at). A failed commit marks nothing."""
    for record, state in written:
        if consumer_state(record) == state:
            record.dirty = False
            key = (record.identity, record.name)
            if changed.get(key) is record:
                del changed[key]


def write_consumers(
    conn: sqlite3.Connection, written: list[tuple[ConsumerRecord, ConsumerState]]
) -> None:
    """Store changed consumers, and delete the rows of deleted ones (inside the caller's
    transaction)."""
    if not written:
        return
    deleted = [(c.identity, c.name) for c, state in written if state[3]]
    if deleted:  # rare (an operator's delete): no statement on a commit's path without it
        conn.executemany("DELETE FROM consumers WHERE identity = ? AND name = ?", deleted)
    ts = now_ms()
    conn.executemany(
        "INSERT OR REPLACE INTO consumers"
        " (identity, name, patterns, cursor, lost_from, lost_to,"
        " updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (
                c.identity,
                c.name,
                orjson.dumps(list(patterns)).decode(),
                cursor,
                lost[0] if lost else None,
                lost[1] if lost else None,
                ts,
            )
            for c, (patterns, cursor, lost, deleted) in written
            if not deleted
        ],
    )
