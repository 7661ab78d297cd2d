"""The message log's SQLite schema, its rows, its upgrade in place, and the writer thread
(spec §6.2, §6.3).

Schema 3 stores **one row per committed batch** in ``batches``, keyed by the ``seq`` of
its first message:

- a batch signed here, or a peer's batch gossiped whole, is one row per commit that
  holds it: ``origin``, ``first`` (its first ``origin_seq``), ``n``, ``root``, ``sig``,
  the leaf hashes, and the bodies of the messages it holds, each as its canonical bytes
  without ``sig`` (a message's audit path is made from the leaves when it is read);
- the other messages of a commit (signed alone, or a peer's batch members that came
  one by one with their proofs) are a row with ``origin`` ``''``, each body its whole
  envelope.

``heads`` holds each message's header (seq, id, topic, origin — ``""`` for the row's own —,
``origin_seq``, ts, ``expires_ms``, body size): what the in-memory indexes
(:mod:`hearthnet.pubsub.logindex`) are rebuilt from when the log opens, read without the
bodies (they are the last column, so SQLite leaves their overflow pages unread). It is a
JSON array of one array per message, or, for a **run row** (our publishes queued
together, committed by :mod:`hearthnet.pubsub.logrun`: consecutive ``seq`` and
``origin_seq``, one ``ts``, no ``expires_ms``, the row's origin), one object
``{seq, origin_seq, ts, topic, ids, sizes}`` (``topic`` a string when the run has one, else
one per message): half the bytes, made without a tuple per message. Retention rewrites a
run row it cuts in the array form.

Schemas 1 (one row per message, each its whole envelope) and 2 (one row per message,
batch members without ``sig`` beside a table of batches) are upgraded in place, in one
transaction, when the log opens: their rows are regrouped, in ``seq`` order, into runs
of one batch (or of whole envelopes, up to :data:`LOOSE_ROW` a row).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import orjson

from hearthnet.pubsub.consumerstate import ConsumerRecord
from hearthnet.pubsub.logfloors import load_removed
from hearthnet.pubsub.logindex import Head, LogIndex
from hearthnet.pubsub.merkle import HASH_BYTES
from hearthnet.pubsub.sequencer import Sequencer

SCHEMA_VERSION = 3
LOOSE_ROW = 1024  # whole envelopes per row when an older log is regrouped
# A new log's page size. A commit's row is mostly its bodies (~40 KiB for 125 messages of
# 256 bytes), written to the WAL a page at a time, each page a frame with its own header
# and checksum: 16 KiB pages take ~0.5 µs of CPU per message off a commit (4 KiB, SQLite's
# default, and 64 KiB pages both cost more; docs/benchmarks-log.md, "Pages of 16 KiB").
PAGE_BYTES = 16_384
# WAL bytes between automatic checkpoints: SQLite's default of 1,000 pages of 4 KiB.
WAL_CHECKPOINT_BYTES = 4_096_000
# Deleted content is zeroed only where that writes no page more (SQLite's FAST). Builds
# that default to secure_delete=ON (Debian's) write every page retention frees again, as
# zeros: as many WAL bytes as the messages deleted, flushed by the next commit's fsync
# (docs/benchmarks-log.md, "Retention's commits without an fsync"). Freed whole pages keep
# their bytes until reused (docs/security.md).
SECURE_DELETE = "FAST"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY,
    origin TEXT NOT NULL,
    first INTEGER NOT NULL,
    n INTEGER NOT NULL,
    heads BLOB NOT NULL,
    root BLOB,
    sig TEXT,
    leaves BLOB,
    bodies BLOB NOT NULL
);
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

INSERT_ROW = (
    "INSERT INTO batches (seq, origin, first, n, heads, root, sig, leaves, bodies)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

T = TypeVar("T")


class HeadColumns(NamedTuple):
    """The headers of a row's messages as columns, in :class:`Head`'s order (what the
    indexes and the sequencer take, and the ``heads`` column is encoded from)."""

    seqs: Sequence[int]
    ids: Sequence[str]
    topics: Sequence[str]
    origins: Sequence[str]
    origin_seqs: Sequence[int]
    ts: Sequence[int]
    expires: Sequence[int | None]
    sizes: Sequence[int]


@dataclass(slots=True)
class Row:
    """One ``batches`` row: a signed batch's messages of one commit, or whole envelopes.

    Its headers are ``heads``, or ``cols`` for a row made as columns (a batch signed in
    this commit: no :class:`Head` per message; ``heads`` is then left empty)."""

    key: int
    origin: str  # "" for whole envelopes
    first: int
    n: int
    heads: list[Head]
    bodies: list[bytes]
    root: bytes | None = None
    sig: str | None = None
    leaves: bytes | None = None
    cols: HeadColumns | None = None

    def columns(self) -> HeadColumns:
        """The headers as columns."""
        if self.cols is not None:
            return self.cols
        return HeadColumns(*zip(*self.heads, strict=True))

    def params(self) -> tuple[Any, ...]:
        """The INSERT parameters (:data:`INSERT_ROW`)."""
        return (
            self.key,
            self.origin,
            self.first,
            self.n,
            pack_columns(self.columns(), self.origin),
            self.root,
            self.sig,
            self.leaves,
            b"".join(self.bodies),
        )


def pack_columns(cols: HeadColumns, origin: str) -> bytes:
    """The ``heads`` column: one JSON array per message (origin ``""`` when the row's),
    encoded from the headers' columns (no list per message in Python)."""
    seqs, ids, topics, origins, origin_seqs, ts, expires, sizes = cols
    if not seqs:
        return b"[]"
    if list(origins).count(origin) == len(origins):
        origins = ("",) * len(origins)
    elif origin:
        origins = tuple("" if o == origin else o for o in origins)
    return orjson.dumps(
        list(zip(seqs, ids, topics, origins, origin_seqs, ts, expires, sizes, strict=True))
    )


def pack_heads(heads: Sequence[Head], origin: str) -> bytes:
    """:func:`pack_columns` of headers."""
    if not heads:
        return b"[]"
    return pack_columns(HeadColumns(*zip(*heads, strict=True)), origin)


def pack_run(  # noqa: PLR0917 - the run's columns, in the object's order
    seq: int, origin_seq: int, ts: int, topics: list[str], ids: list[str], sizes: list[int]
) -> bytes:
    """The ``heads`` column of a run row (see the module's docstring): messages numbered
    from ``seq`` and ``origin_seq``, all of time ``ts``, without ``expires_ms``."""
    topic: str | list[str] = topics[0] if topics.count(topics[0]) == len(topics) else topics
    return orjson.dumps(
        {"seq": seq, "origin_seq": origin_seq, "ts": ts, "topic": topic, "ids": ids, "sizes": sizes}
    )


def _run_columns(run: dict[str, Any], origin: str) -> Iterator[tuple[Any, ...]]:
    """A run row's headers, one tuple per message in :class:`Head`'s order."""
    ids = run["ids"]
    n, seq, origin_seq, topic = len(ids), run["seq"], run["origin_seq"], run["topic"]
    return zip(
        range(seq, seq + n),
        ids,
        repeat(topic, n) if type(topic) is str else topic,
        repeat(origin, n),
        range(origin_seq, origin_seq + n),
        repeat(run["ts"], n),
        repeat(None, n),
        run["sizes"],
        strict=True,
    )


def unpack_heads(blob: bytes, origin: str) -> list[Head]:
    """The headers of a ``heads`` column (either form)."""
    fields = orjson.loads(blob)
    if type(fields) is dict:
        return list(map(Head._make, _run_columns(fields, origin)))
    if origin:  # a batch's row: every message is the batch origin's
        for head in fields:
            head[3] = origin
    return list(map(Head._make, fields))


def head_arrays(blob: bytes) -> list[list[Any]]:
    """A ``heads`` column (either form) as one JSON array per message, as the array form
    stores it (origin ``""`` when the row's): what retention reads and writes back."""
    fields = orjson.loads(blob)
    if type(fields) is dict:
        return list(map(list, _run_columns(fields, "")))
    return cast("list[list[Any]]", fields)


def leaf_hashes(leaves: bytes) -> list[bytes]:
    """The ``leaves`` column as the list of leaf hashes."""
    return [leaves[j : j + HASH_BYTES] for j in range(0, len(leaves), HASH_BYTES)]


def split_bodies(heads: Sequence[Head], bodies: bytes) -> list[bytes]:
    """The ``bodies`` column cut at each header's size."""
    out, at = [], 0
    for head in heads:
        out.append(bodies[at : at + head.size])
        at += head.size
    return out


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a log of schema 1 or 2 to :data:`SCHEMA_VERSION` in place, in one transaction
    (run before and after :data:`SCHEMA`)."""
    if not _columns(conn, "messages"):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        old_batches = _columns(conn, "batches")
        if old_batches and "heads" not in old_batches:
            conn.execute("ALTER TABLE batches RENAME TO batches_v2")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        _regroup(conn, "batch" in _columns(conn, "messages"), bool(old_batches))
        conn.execute("DROP TABLE messages")
        if old_batches and "heads" not in old_batches:
            conn.execute("DROP TABLE batches_v2")
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
        )
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def _regroup(conn: sqlite3.Connection, has_batch: bool, has_batches: bool) -> None:
    """Rewrite per-message rows as rows of batches (schema 2 members) and of whole
    envelopes (everything else), in seq order."""
    signed: dict[tuple[str, int], tuple[int, bytes, str, bytes]] = {}
    if has_batches:
        for origin, first, n, root, sig, leaves in conn.execute(
            "SELECT origin, first, n, root, sig, leaves FROM batches_v2"
        ):
            signed[(origin, first)] = (n, root, sig, leaves)
    head_seq = 0
    run: Row | None = None
    batch_col = "batch" if has_batch else "NULL"
    for seq, mid, topic, origin, oseq, ts, expires, stored, first in conn.execute(
        "SELECT seq, id, topic, origin, origin_seq, ts, expires_ms, raw,"
        f" {batch_col} FROM messages ORDER BY seq"
    ):  # streamed: a log of 1 GiB is not read into memory
        head_seq = seq
        if first is not None and (origin, first) not in signed:
            continue  # a member stored without sig whose batch is gone: never readable
        key = (origin, first) if first is not None else None
        same = run is not None and (
            (key is None and run.origin == "" and len(run.heads) < LOOSE_ROW)
            or (key is not None and (run.origin, run.first) == key)
        )
        if not same:
            if run is not None:
                conn.execute(INSERT_ROW, run.params())
            if key is None:
                run = Row(seq, "", 0, 0, [], [])
            else:
                n, root, sig, leaves = signed[key]
                run = Row(seq, origin, key[1], n, [], [], root, sig, leaves)
        assert run is not None
        raw = bytes(stored)
        run.heads.append(Head(seq, mid, topic, origin, oseq, ts, expires, len(raw)))
        run.bodies.append(raw)
    if run is not None:
        conn.execute(INSERT_ROW, run.params())
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('head_seq', ?)", (str(head_seq),)
    )


class SqliteWriter:
    """One SQLite connection owned by one thread; each :meth:`run` is a single trip.

    Jobs run one at a time, in the order they were submitted, so a job that spans
    ``BEGIN`` .. ``COMMIT`` is a transaction nobody else interleaves with. While no job is
    queued or running (:attr:`idle`), :meth:`run_here` runs one in the calling thread
    instead: no hand-over to the thread and back.

    The thread is the writer's own, blocked on a queue between jobs; a job's result goes
    back with one ``call_soon_threadsafe``. A thread pool's trip (its work item, a
    ``concurrent.futures`` future chained to the loop's) cost twice the CPU on the event
    loop and twice the wall time per job.
    """

    def __init__(self, path: Path, synchronous: str) -> None:
        self.path = path
        self.synchronous = synchronous
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._busy = 0  # jobs handed to the thread and not finished

    @property
    def idle(self) -> bool:
        """True when connected and no job is queued or running in the thread."""
        return self._conn is not None and not self._busy

    def run_here(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` with the connection in the calling thread; only while :attr:`idle`
        (the caller keeps :meth:`run` from being called until this returns)."""
        conn = self._conn
        if conn is None or self._busy:
            raise RuntimeError("the log's writer is busy or not connected")
        return job(conn)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.executescript(
            f"PRAGMA page_size={PAGE_BYTES}; PRAGMA journal_mode=WAL; "
            f"PRAGMA synchronous={self.synchronous}; PRAGMA busy_timeout=5000;"
            f" PRAGMA secure_delete={SECURE_DELETE};"
        )
        # The WAL is checkpointed at the same size whatever a log's pages (an older log
        # keeps its 4 KiB pages: a page size is set only when the file is made).
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute(f"PRAGMA wal_autocheckpoint={max(1, WAL_CHECKPOINT_BYTES // page)}")
        migrate(conn)
        conn.executescript(SCHEMA)
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
        )
        self._conn = conn
        return conn

    def _work(self) -> None:
        """The writer thread: run jobs until the queue yields None."""
        jobs = self._jobs
        while (item := jobs.get()) is not None:
            call, future, loop = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting task, as a pool would
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._finished, future, result, error)
            del item, call, future, result, error  # nothing of the last job kept while idle

    async def _trip(self, call: Callable[[], T]) -> T:
        """Run ``call`` in the writer thread (started on first use)."""
        loop = asyncio.get_running_loop()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="hearthnet-log", daemon=True)
            self._thread.start()
        future: asyncio.Future[Any] = loop.create_future()
        self._busy += 1  # until the thread is done with it, even if nobody waits any more
        self._jobs.put((call, future, loop))
        result: T = await future
        return result

    def _finished(
        self, future: asyncio.Future[Any], result: Any, exc: BaseException | None
    ) -> None:
        """On the loop: the thread is done with a job; hand its outcome to its future
        (nobody waits if it was cancelled)."""
        self._busy -= 1
        if future.cancelled():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    async def run(self, job: Callable[[sqlite3.Connection], T], *, fsync: bool = True) -> T:
        """Run ``job`` with the connection in the writer thread (connecting on first use).

        ``fsync=False`` (retention's deletes): with ``synchronous=FULL`` the job's
        transactions commit as with ``NORMAL``, without an ``fsync`` of their own (see
        :meth:`_without_fsync`)."""
        if fsync or self.synchronous != "FULL":
            return await self._trip(lambda: job(self._conn or self._connect()))
        return await self._trip(lambda: self._without_fsync(job))

    def _without_fsync(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` with ``synchronous=NORMAL``, then the connection back to ``FULL``.

        What that gives up is only the job's own durability, never an acknowledged
        publish's: in WAL mode a ``NORMAL`` commit appends its frames to the WAL without
        an ``fsync``, and a checkpoint or a WAL restart that happens in it syncs exactly
        as under ``FULL`` (the WAL before the pages are copied, the database file after,
        the WAL header when the WAL is reused: SQLite keeps a WAL database consistent
        with ``NORMAL``). The WAL is written in commit order and the next ``FULL`` commit's
        ``fdatasync`` flushes every frame before its own, so a power cut loses at most
        the deletes committed since the last durable publish, which the next retention
        pass makes again. When the connection cannot be set back to ``FULL`` it is
        closed, so that no publish commits on it (the next job connects again)."""
        conn = self._conn or self._connect()
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            return job(conn)
        finally:
            try:
                conn.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error:
                self._conn = None
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                raise

    async def close(self) -> None:
        """Close the connection and stop the thread (after the jobs already queued)."""

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        if self._thread is None:
            return
        await self._trip(close)
        self._jobs.put(None)
        self._thread = None


# A job for the writer thread: what to run, the future it settles, the loop it belongs to.
_Job = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


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
class LoadedLog:
    """What :func:`load` reads from a log before it serves."""

    epoch: str
    sequencer: Sequencer
    index: LogIndex
    consumers: dict[tuple[str, str], ConsumerRecord] = field(default_factory=dict)


def _meta_int(conn: sqlite3.Connection, key: str) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return int(row[0]) if row else 0


def held_heads(conn: sqlite3.Connection) -> Iterator[tuple[int, list[Head]]]:
    """Each row's key and headers, in key order (the bodies are not read)."""
    for key, origin, heads in conn.execute("SELECT seq, origin, heads FROM batches ORDER BY seq"):
        yield key, unpack_heads(heads, origin)


def topic_bodies(conn: sqlite3.Connection, topic: str, since_ts: int) -> Iterator[bytes]:
    """The stored bodies of ``topic``'s messages with ``ts >= since_ts``, in seq order,
    from a log opened by anyone (tools reading a node's log file); only the rows that
    hold some are read whole."""
    wanted: list[tuple[int, set[int]]] = []
    for key, heads in held_heads(conn):
        seqs = {h.seq for h in heads if h.topic == topic and h.ts >= since_ts}
        if seqs:
            wanted.append((key, seqs))
    for key, seqs in wanted:
        found = conn.execute(
            "SELECT origin, heads, bodies FROM batches WHERE seq = ?", (key,)
        ).fetchone()
        if found is None:
            continue
        heads = unpack_heads(found[1], found[0])
        for head, body in zip(heads, split_bodies(heads, found[2]), strict=True):
            if head.seq in seqs:
                yield body


def load(conn: sqlite3.Connection, node_id: str) -> LoadedLog:
    """Epoch (made on first use), the indexes and the sequencer rebuilt from every row's
    headers, and the consumers (writer thread)."""
    row = conn.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()
    if row is None:
        epoch = os.urandom(8).hex()
        conn.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (epoch,))
    else:
        epoch = str(row[0])
    index = LogIndex()
    origin_seq = _meta_int(conn, "origin_seq")
    sequencer = Sequencer(0, 0)
    for key, heads in held_heads(conn):  # a row at a time: no list of every header
        index.add_row(key, heads)
        if heads:
            seqs, ids, topics, _, _, ts, _, sizes = zip(*heads, strict=True)
            sequencer.committed_columns(seqs, ids, topics, sizes, ts)
        for h in heads:
            if h.origin == node_id and h.origin_seq > origin_seq:
                origin_seq = h.origin_seq
    # meta keeps the counters when retention removed our latest messages
    sequencer.head_seq = max(sequencer.head_seq, _meta_int(conn, "head_seq"))
    sequencer.origin_seq = origin_seq
    load_removed(conn, index)
    out = LoadedLog(epoch, sequencer, index)
    for identity, name, patterns, cursor, lost_from, lost_to in conn.execute(
        "SELECT identity, name, patterns, cursor, lost_from, lost_to FROM consumers"
    ):
        lost = (lost_from, lost_to) if lost_from is not None else None
        out.consumers[(identity, name)] = ConsumerRecord(
            identity, name, tuple(orjson.loads(patterns)), cursor, lost
        )
    return out
