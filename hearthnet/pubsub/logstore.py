"""The message log's SQLite schema, its upgrade in place, and the writer thread (spec §6.3).

Schema 2 stores a batch signed here once, in ``batches`` (origin, first ``origin_seq``,
``n``, root, signature, the leaf hashes), and each of its messages in ``messages`` as its
canonical bytes without ``sig``, with ``batch`` = the batch's first ``origin_seq``; a
message's audit path is made from the batch's leaves when it is read (spec §6.2). Rows
with ``batch`` NULL hold the whole envelope, ``sig`` included: messages signed alone,
messages from peers, and every row written by schema 1, which is upgraded in place (a
column and a table added; nothing rewritten), so one log holds both kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import orjson

from hearthnet.pubsub.consumerstate import ConsumerRecord
from hearthnet.pubsub.topics import TopicPattern

SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    topic TEXT NOT NULL,
    origin TEXT NOT NULL,
    origin_seq INTEGER NOT NULL,
    ts INTEGER NOT NULL,
    expires_ms INTEGER,
    size INTEGER NOT NULL,
    raw BLOB NOT NULL,
    batch INTEGER
);
CREATE INDEX IF NOT EXISTS messages_topic ON messages (topic, seq);
CREATE INDEX IF NOT EXISTS messages_origin ON messages (origin, origin_seq);
CREATE INDEX IF NOT EXISTS messages_ts ON messages (ts);
CREATE TABLE IF NOT EXISTS batches (
    origin TEXT NOT NULL,
    first INTEGER NOT NULL,
    n INTEGER NOT NULL,
    root BLOB NOT NULL,
    sig TEXT NOT NULL,
    leaves BLOB NOT NULL,
    PRIMARY KEY (origin, first)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS consumers (
    identity TEXT NOT NULL,
    name TEXT NOT NULL,
    patterns TEXT NOT NULL,
    cursor INTEGER NOT NULL,
    lost_from INTEGER,
    lost_to INTEGER,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (identity, name)
);
"""

T = TypeVar("T")

# Readers never see a message past its own ttl_s (spec §6.3), even before retention
# deletes it or while a durable consumer holds it: bound to the read's time.
UNEXPIRED = "(expires_ms IS NULL OR expires_ms > ?)"


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a log of an older schema up to :data:`SCHEMA_VERSION` in place (after
    :data:`SCHEMA`, which creates what is missing but changes no existing table)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(messages)")}
    if "batch" not in columns:
        # Schema 1: every row holds its whole envelope; they stay as they are.
        conn.execute("ALTER TABLE messages ADD COLUMN batch INTEGER")
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
    )


class SqliteWriter:
    """One SQLite connection owned by one thread; each :meth:`run` is a single trip.

    Jobs run one at a time, in the order they were submitted, so a job that spans
    ``BEGIN`` .. ``COMMIT`` is a transaction nobody else interleaves with.
    """

    def __init__(self, path: Path, synchronous: str) -> None:
        self.path = path
        self.synchronous = synchronous
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hearthnet-log")
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.executescript(
            f"PRAGMA journal_mode=WAL; PRAGMA synchronous={self.synchronous}; "
            "PRAGMA busy_timeout=5000;" + SCHEMA
        )
        migrate(conn)
        self._conn = conn
        return conn

    async def run(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` with the connection in the writer thread (connecting on first use)."""

        def call() -> T:
            return job(self._conn or self._connect())

        return await asyncio.get_running_loop().run_in_executor(self._thread, call)

    async def close(self) -> None:
        """Close the connection and stop the thread (after the jobs already queued)."""

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._thread, close)
        self._thread.shutdown(wait=False)


def transaction(conn: sqlite3.Connection, work: Callable[[], T]) -> T:
    """``work`` between BEGIN and COMMIT; rolled back (and re-raised) on any failure."""
    conn.execute("BEGIN")
    try:
        result = work()
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    return result


@dataclass(slots=True)
class TopicStats:
    """What the log holds of one topic (kept in memory, exact)."""

    messages: int = 0
    bytes: int = 0
    head_seq: int = 0
    last_ts: int = 0


@dataclass(slots=True)
class LoadedLog:
    """What :func:`load` reads from a log before it serves."""

    epoch: str
    head_seq: int
    origin_seq: int
    topics: dict[str, TopicStats] = field(default_factory=dict)
    total_bytes: int = 0
    consumers: dict[tuple[str, str], ConsumerRecord] = field(default_factory=dict)


def load(conn: sqlite3.Connection, node_id: str) -> LoadedLog:
    """Epoch (made on first use), heads, topic stats and consumers (writer thread)."""
    row = conn.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()
    if row is None:
        epoch = os.urandom(8).hex()
        conn.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (epoch,))
    else:
        epoch = str(row[0])
    head_seq = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM messages").fetchone()[0])
    stored_origin = int(
        conn.execute(
            "SELECT COALESCE(MAX(origin_seq), 0) FROM messages WHERE origin = ?", (node_id,)
        ).fetchone()[0]
    )
    row = conn.execute("SELECT value FROM meta WHERE key='origin_seq'").fetchone()
    # meta keeps the counter even when retention has removed our latest messages
    out = LoadedLog(epoch, head_seq, max(stored_origin, int(row[0]) if row else 0))
    for topic, count, size, head, last_ts in conn.execute(
        "SELECT topic, COUNT(*), SUM(size), MAX(seq), MAX(ts) FROM messages GROUP BY topic"
    ):
        out.topics[topic] = TopicStats(count, size, head, last_ts)
        out.total_bytes += size
    for identity, name, patterns, cursor, lost_from, lost_to in conn.execute(
        "SELECT identity, name, patterns, cursor, lost_from, lost_to FROM consumers"
    ):
        lost = (lost_from, lost_to) if lost_from is not None else None
        out.consumers[(identity, name)] = ConsumerRecord(
            identity, name, tuple(orjson.loads(patterns)), cursor, lost
        )
    return out


def _sql_prefix(pattern: str) -> str:
    """The literal leading segments of a pattern, as a topic prefix for an index range."""
    parts: list[str] = []
    for seg in pattern.split("."):
        if seg in ("*", "**"):
            return ".".join(parts) + "." if parts else ""
        parts.append(seg)
    return pattern


def topic_filter(patterns: list[TopicPattern]) -> tuple[str, list[str]]:
    """An SQL condition on ``topic`` that every topic matching a pattern meets (literal
    topics, or a range per literal prefix; ``1`` when a pattern starts with a wildcard),
    with its arguments. Rows still need an exact :meth:`TopicPattern.matches`."""
    literal = [p.text for p in patterns if p.is_literal]
    clauses: list[str] = []
    args: list[str] = []
    if literal:
        clauses.append(f"topic IN ({','.join('?' * len(literal))})")
        args += literal
    for pattern in patterns:
        if pattern.is_literal:
            continue
        prefix = _sql_prefix(pattern.text)
        if not prefix:
            return "1", []
        clauses.append("(topic >= ? AND topic < ?)")
        args += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
    return " OR ".join(clauses), args
