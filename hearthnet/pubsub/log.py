"""The node's message log in SQLite (spec §6.3, §6.4): group commit, seq, epoch, dedupe.

One writer and one reader connection (WAL lets reads run beside the writer). A local
publish is numbered (``origin_seq``) when it is queued; the flush loop takes everything
queued and hands the batch to the writer thread as **one job**: sign the local publishes,
drop peers' duplicates, assign ``seq``, insert, commit. One hand-over per batch matters:
each trip between the event loop and a worker thread waits for the GIL, and a busy loop
(fan-out to a thousand sockets) made a trip per statement cost milliseconds. Only after
the commit does the loop move ``head_seq``, hand the batch to fan-out (``on_commit``) and
resolve the publishers' futures: a publish is acknowledged only once durable, and a
``seq`` is never handed out twice, even across a crash.

A publish that cannot be signed fails alone (its publisher gets the error; the rest of
the batch commits). A batch whose transaction fails for one of its messages is written
again one message at a time, so one bad message costs its own publish, never the others
nor the flush loop; when SQLite itself fails (disk full, I/O), the batch is refused with
``unavailable``.
The queue of pending messages is bounded (``max_pending``): past it a publish is refused
with ``unavailable`` and a ``retry_after_ms``.

``synchronous=FULL`` (the default) makes an acknowledged publish survive a power cut;
``normal`` survives a process crash (``kill -9``) only.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import orjson

from hearthnet.clock import now_ms
from hearthnet.errors import HearthNetError, InternalError, StorageError, Unavailable, WireError
from hearthnet.identity import KeyPair
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.topics import TopicPattern

log = logging.getLogger("hearthnet.pubsub.log")

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
    raw BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_topic ON messages (topic, seq);
CREATE INDEX IF NOT EXISTS messages_origin ON messages (origin, origin_seq);
CREATE INDEX IF NOT EXISTS messages_ts ON messages (ts);
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

RECENT_IDS = 200_000
INSERT_ROWS = 256  # rows per INSERT statement (9 parameters each; SQLite allows 32,766)
PAGE = 500
READ_LAST_QUERIES = 2000  # since {last: N}: most topics read one by one before walking back
READ_LAST_SEARCH = 10_000  # ... and most topics in the log searched for matches
DELETE_CHUNK = 500  # messages per retention transaction
MAX_PENDING = 16_384  # publishes queued for the writer (a few commits' worth)
PENDING_RETRY_MS = 200  # retry_after_ms when the queue is full: about one commit


@dataclass(slots=True)
class TopicStats:
    """What the log holds of one topic (kept in memory, exact)."""

    messages: int = 0
    bytes: int = 0
    head_seq: int = 0
    last_ts: int = 0


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[StoredMessage | None]
    message: Message | None  # None until a local publish is signed (in its commit job)
    local: bool = False  # our own publish (never a duplicate)
    source: str | None = None  # the peer a message came from
    unsigned: dict[str, Any] | None = None  # a local publish's fields before signing


@dataclass(slots=True)
class ConsumerRecord:
    """A durable consumer's stored state (spec §6.8)."""

    identity: str
    name: str
    patterns: tuple[str, ...]
    cursor: int
    lost: tuple[int, int] | None = None
    dirty: bool = field(default=False, compare=False)


_ConsumerState = tuple[tuple[str, ...], int, tuple[int, int] | None]

# What became of one pending message in a commit: stored, a duplicate (None), or refused.
_Outcome = StoredMessage | HearthNetError | None


def _state(record: ConsumerRecord) -> _ConsumerState:
    """What of a consumer is stored: patterns, cursor, lost range."""
    return (record.patterns, record.cursor, record.lost)


def _mark_clean(written: list[tuple[ConsumerRecord, _ConsumerState]]) -> None:
    """After the commit: a consumer is clean unless it changed while it was being written
    (then it stays dirty and goes with the next commit). A failed commit marks nothing."""
    for record, state in written:
        if _state(record) == state:
            record.dirty = False


def _sql_prefix(pattern: str) -> str:
    """The literal leading segments of a pattern, as a topic prefix for an index range."""
    parts: list[str] = []
    for seg in pattern.split("."):
        if seg in ("*", "**"):
            return ".".join(parts) + "." if parts else ""
        parts.append(seg)
    return pattern


def _topic_filter(patterns: list[TopicPattern]) -> tuple[str, list[str]]:
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


def _known_ids(conn: sqlite3.Connection, ids: list[str]) -> set[str]:
    """Which of these ids the log already holds (peers' messages after a restart)."""
    known: set[str] = set()
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        rows = conn.execute(
            f"SELECT id FROM messages WHERE id IN ({','.join('?' * len(chunk))})", chunk
        )
        known.update(r[0] for r in rows)
    return known


def _write_consumers(
    conn: sqlite3.Connection, written: list[tuple[ConsumerRecord, _ConsumerState]]
) -> None:
    """Store changed consumers (inside the caller's transaction)."""
    if not written:
        return
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
            for c, (patterns, cursor, lost) in written
        ],
    )


def _sign_local(keys: KeyPair, batch: list[_Pending]) -> dict[int, HearthNetError]:
    """Sign the batch's local publishes (in the writer thread), one batch signature per
    run of consecutive ``origin_seq`` (spec §6.2): a publish refused here (data the edge
    let through but JCS cannot sign) leaves its number unused and splits the run.
    Returns the refused publishes by position."""
    refused: dict[int, HearthNetError] = {}
    run: list[tuple[_Pending, dict[str, Any], bytes]] = []

    def close_run() -> None:
        if run:
            bodies = [body for _, body, _ in run]
            signed = Message.signed_batch(keys, bodies, [leaf for _, _, leaf in run])
            for (pending, _, _), message in zip(run, signed, strict=True):
                pending.message = message
                pending.unsigned = None
            run.clear()

    for i, pending in enumerate(batch):
        body = pending.unsigned
        if pending.message is not None or body is None:
            continue  # a peer's message, or ours signed by an earlier attempt
        try:
            leaf = canonical_body(body)
        except HearthNetError as exc:
            refused[i] = exc
            close_run()
            continue
        if run and run[-1][1]["origin_seq"] + 1 != body["origin_seq"]:
            close_run()
        run.append((pending, body, leaf))
    close_run()
    return refused


def _transaction(conn: sqlite3.Connection, work: Callable[[], T]) -> T:
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


class MessageLog:
    """Append-only, deduplicated, group-committed log of every message the node holds."""

    def __init__(
        self,
        path: Path,
        keys: KeyPair,
        *,
        synchronous: str = "full",
        max_batch: int = 1024,
        max_pending: int = MAX_PENDING,
        on_commit: Callable[[list[StoredMessage]], None] | None = None,
    ) -> None:
        self.path = path
        self.keys = keys
        self.synchronous = synchronous.upper()
        if self.synchronous not in ("FULL", "NORMAL"):
            raise StorageError("pubsub.sync must be 'full' or 'normal'")
        self.max_batch = max_batch
        self.max_pending = max_pending
        # Called after every commit, in order (the node registers its commit pipeline:
        # local fan-out, then gossip; see Node._wire).
        self.listeners: list[Callable[[list[StoredMessage]], None]] = (
            [on_commit] if on_commit else []
        )
        self.epoch = ""
        self.head_seq = 0
        self.origin_seq = 0
        self.topics: dict[str, TopicStats] = {}
        self.total_bytes = 0
        self.consumers: dict[tuple[str, str], ConsumerRecord] = {}
        self._writer: SqliteWriter | None = None
        self._reader: aiosqlite.Connection | None = None
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._recent_ids: OrderedDict[str, None] = OrderedDict()
        self.batches = 0
        self.closed = False

    # --- opening ------------------------------------------------------------------

    async def open(self) -> None:
        """Open (creating on first use) and load epoch, heads, topic stats and consumers."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = SqliteWriter(self.path, self.synchronous)
        try:
            await writer.run(self._load)
            self._reader = await aiosqlite.connect(f"file:{self.path}?mode=ro", uri=True)
            await self._reader.execute("PRAGMA query_only=1")
        except sqlite3.Error as exc:
            await writer.close()
            raise StorageError(f"cannot open the message log {self.path}: {exc}") from exc
        self._writer = writer

    def _load(self, conn: sqlite3.Connection) -> None:
        """Read what the log holds into memory (in the writer thread, before serving)."""
        row = conn.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()
        if row is None:
            self.epoch = os.urandom(8).hex()
            conn.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (self.epoch,))
        else:
            self.epoch = str(row[0])
        self.head_seq = int(
            conn.execute("SELECT COALESCE(MAX(seq), 0) FROM messages").fetchone()[0]
        )
        stored_origin = int(
            conn.execute(
                "SELECT COALESCE(MAX(origin_seq), 0) FROM messages WHERE origin = ?",
                (self.keys.node_id,),
            ).fetchone()[0]
        )
        row = conn.execute("SELECT value FROM meta WHERE key='origin_seq'").fetchone()
        # meta keeps the counter even when retention has removed our latest messages
        self.origin_seq = max(stored_origin, int(row[0]) if row else 0)
        for topic, count, size, head, last_ts in conn.execute(
            "SELECT topic, COUNT(*), SUM(size), MAX(seq), MAX(ts) FROM messages GROUP BY topic"
        ):
            self.topics[topic] = TopicStats(count, size, head, last_ts)
            self.total_bytes += size
        for identity, name, patterns, cursor, lost_from, lost_to in conn.execute(
            "SELECT identity, name, patterns, cursor, lost_from, lost_to FROM consumers"
        ):
            lost = (lost_from, lost_to) if lost_from is not None else None
            self.consumers[(identity, name)] = ConsumerRecord(
                identity, name, tuple(orjson.loads(patterns)), cursor, lost
            )

    async def close(self) -> None:
        """Flush what is queued, then close both connections."""
        if self.closed:
            return
        self.closed = True  # stops run(); what is queued is flushed here
        self._wake.set()
        if self._pending and self._writer is not None:
            await self._flush_all()
        await self._persist_consumers()
        if self._reader is not None:
            await self._reader.close()
        if self._writer is not None:
            await self._writer.close()
        self._reader = self._writer = None

    # --- appending ----------------------------------------------------------------

    def publish(
        self,
        *,
        topic: str,
        msg_type: str,
        data: Any,
        ttl_s: int | None = None,
        sender: dict[str, str] | None = None,
    ) -> asyncio.Future[StoredMessage | None]:
        """Queue a local publish; the future resolves once it is committed (spec §6.4).

        The future fails with the publish's own error when it cannot be signed
        (:class:`~hearthnet.errors.NotCanonical`) or stored (``unavailable``).

        Raises:
            Unavailable: the node is shutting down, or ``max_pending`` publishes wait.
        """
        if self.closed:
            raise Unavailable("the node is shutting down", retry_after_ms=1000)
        if len(self._pending) >= self.max_pending:
            raise Unavailable(
                f"the message log has {self.max_pending} publishes waiting; retry",
                retry_after_ms=PENDING_RETRY_MS,
            )
        # Numbered now; signed with its batch in the writer thread (ed25519 runs without
        # the GIL, so parsing the next publishes goes on meanwhile).
        # A number whose batch fails to commit is never reused (peers treat it like a hole
        # left by retention); one issued but lost in a crash was never acknowledged.
        body = Message.unsigned(
            self.keys.node_id,
            topic=topic,
            msg_type=msg_type,
            data=data,
            origin_seq=self.origin_seq + 1,
            ts=now_ms(),
            ttl_s=ttl_s,
            sender=sender,
        )
        self.origin_seq += 1
        fut: asyncio.Future[StoredMessage | None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(fut, None, local=True, unsigned=body))
        self._wake.set()
        return fut

    def ingest(
        self, message: Message, source: str | None = None
    ) -> asyncio.Future[StoredMessage | None]:
        """Queue a verified message from a peer; resolves to None when it was a duplicate."""
        fut: asyncio.Future[StoredMessage | None] = asyncio.get_running_loop().create_future()
        if message.id in self._recent_ids:
            fut.set_result(None)
            return fut
        self._pending.append(_Pending(fut, message, source=source))
        self._wake.set()
        return fut

    def knows(self, message_id: str) -> bool:
        """True when the id was committed recently (cheap dedupe before verifying)."""
        return message_id in self._recent_ids

    async def run(self) -> None:
        """The flush loop: one transaction per batch, as soon as the previous one is done."""
        while not self.closed:
            await self._wake.wait()
            self._wake.clear()
            if not self.closed:
                await self._flush_all()

    async def _flush_all(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            await self._commit(batch)

    async def _commit(self, batch: list[_Pending]) -> None:
        """Commit one batch; when its transaction fails, each message alone.

        Never raises: every failure ends up on the futures of the publishes it concerns.
        """
        try:
            outcomes = await self._write(batch)
        except Exception as exc:  # a flush loop that dies stops every publish
            # A full disk, an I/O error or a lock (OperationalError) fails every message
            # alike; anything else may be one message's doing, so the others go alone.
            if len(batch) == 1 or isinstance(exc, sqlite3.OperationalError):
                self._refuse(batch, exc)
                return
            log.warning(
                "commit of %d messages failed (%s); writing them one by one", len(batch), exc
            )
            for pending in batch:
                await self._commit([pending])
            return
        self._done(batch, outcomes)

    async def _write(self, batch: list[_Pending]) -> list[_Outcome]:
        """One commit job for ``batch``; the counters move only after it committed."""
        assert self._writer is not None
        async with self._write_lock:
            # Snapshots for the writer thread: what it reads must not change under it.
            consumers = [(c, _state(c)) for c in self.consumers.values() if c.dirty]
            recent = {
                p.message.id
                for p in batch
                if p.message is not None and not p.local and p.message.id in self._recent_ids
            }
            head = self.head_seq
            outcomes = await self._writer.run(
                lambda conn: self._write_batch(conn, batch, head, recent, consumers)
            )
            _mark_clean(consumers)
        return outcomes

    def _refuse(self, batch: list[_Pending], exc: Exception) -> None:
        """Fail the publishes of a batch that could not be committed (nothing was handed
        out: the counters stay where they were)."""
        error: WireError
        if isinstance(exc, sqlite3.Error | StorageError):
            log.error("commit of %d messages failed: %s", len(batch), exc)
            error = Unavailable("the message log could not commit; retry", retry_after_ms=1000)
        elif isinstance(exc, WireError):
            error = exc
        else:
            log.error("commit of %d messages failed", len(batch), exc_info=exc)
            error = InternalError("the message log could not store this message")
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(error)

    def _done(self, batch: list[_Pending], outcomes: list[_Outcome]) -> None:
        """After a commit: move the heads, hand the batch to fan-out, answer publishers."""
        self.batches += 1
        committed = [item for item in outcomes if isinstance(item, StoredMessage)]
        if committed:
            self.head_seq = committed[-1].seq
        for item in committed:
            self._remember(item)
        for listener in self.listeners:
            try:
                listener(committed)
            except Exception:
                # What is committed stays committed: a listener's bug is logged, and the
                # publishers are still answered.
                log.exception("a commit listener failed")
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.future.done():
                continue
            if isinstance(outcome, HearthNetError):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)

    def _write_batch(
        self,
        conn: sqlite3.Connection,
        batch: list[_Pending],
        head_seq: int,
        known: set[str],
        consumers: list[tuple[ConsumerRecord, _ConsumerState]],
    ) -> list[_Outcome]:
        """The commit job (writer thread): sign our publishes (ed25519 runs without the
        GIL), drop peers' messages the log already holds, number the rest after
        ``head_seq``, insert them and the changed consumers, commit. Returns, per pending
        item, what was stored (None: a duplicate; an error: this publish failed alone)."""
        refused = _sign_local(self.keys, batch)
        remote = [p.message.id for p in batch if p.message is not None and not p.local]
        if remote:
            known = known | _known_ids(conn, remote)
        results: list[_Outcome] = []
        seq = head_seq
        for i, pending in enumerate(batch):
            msg = pending.message
            if msg is None:
                results.append(refused[i])
                continue
            if not pending.local:
                if msg.id in known:
                    results.append(None)
                    continue
                known.add(msg.id)  # a second copy in the same batch is a duplicate
            seq += 1
            results.append(StoredMessage(seq, msg, pending.source))
        rows = [
            (
                s.seq,
                s.message.id,
                s.message.topic,
                s.message.origin,
                s.message.origin_seq,
                s.message.ts,
                s.message.expires_ms,
                len(s.message.raw),
                s.message.raw,
            )
            for s in results
            if isinstance(s, StoredMessage)
        ]

        def work() -> None:
            # Many rows per statement: each statement step gives up and retakes the GIL,
            # which waits while the event loop is busy.
            for i in range(0, len(rows), INSERT_ROWS):
                chunk = rows[i : i + INSERT_ROWS]
                conn.execute(
                    "INSERT INTO messages"
                    " (seq, id, topic, origin, origin_seq, ts, expires_ms, size, raw)"
                    " VALUES " + ",".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk)),
                    [value for row in chunk for value in row],
                )
            _write_consumers(conn, consumers)

        _transaction(conn, work)
        return results

    def _remember(self, item: StoredMessage) -> None:
        msg = item.message
        self._recent_ids[msg.id] = None
        if len(self._recent_ids) > RECENT_IDS:
            self._recent_ids.popitem(last=False)
        stats = self.topics.get(msg.topic)
        if stats is None:
            stats = self.topics[msg.topic] = TopicStats()
        stats.messages += 1
        stats.bytes += len(msg.raw)
        stats.head_seq = item.seq
        stats.last_ts = max(stats.last_ts, msg.ts)
        self.total_bytes += len(msg.raw)

    # --- durable consumers --------------------------------------------------------

    def consumer(self, identity: str, name: str) -> ConsumerRecord | None:
        """A stored consumer, or None."""
        return self.consumers.get((identity, name))

    def save_consumer(self, record: ConsumerRecord) -> None:
        """Create or change a consumer; written with the next commit (or close)."""
        record.dirty = True
        self.consumers[(record.identity, record.name)] = record
        self._wake.set()

    async def _persist_consumers(self) -> None:
        if self._writer is None:
            return
        async with self._write_lock:
            written = [(c, _state(c)) for c in self.consumers.values() if c.dirty]
            if not written:
                return
            await self._writer.run(
                lambda conn: _transaction(conn, lambda: _write_consumers(conn, written))
            )
            _mark_clean(written)

    # --- reading ------------------------------------------------------------------

    async def _rows(self, sql: str, args: Iterable[Any]) -> list[StoredMessage]:
        assert self._reader is not None
        try:
            rows = await self._reader.execute_fetchall(sql, tuple(args))
        except sqlite3.Error as exc:
            raise StorageError(f"reading the message log failed: {exc}") from exc
        # Stored messages were verified before they were stored: rebuilt without paying
        # for the signature again.
        return [
            StoredMessage(seq, Message.trusted(orjson.loads(raw), bytes(raw))) for seq, raw in rows
        ]

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
        where, topic_args = _topic_filter(patterns)
        args: list[Any] = [after_seq, upto_seq, *topic_args, now_ms()]
        ts_clause = " AND ts >= ?" if min_ts is not None else ""
        if min_ts is not None:
            args.append(min_ts)
        out: list[StoredMessage] = []
        cursor = after_seq
        while len(out) < limit and cursor < upto_seq:
            page_args = [cursor, *args[1:]]
            rows = await self._rows(
                f"SELECT seq, raw FROM messages WHERE seq > ? AND seq <= ? AND ({where})"
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
                f"SELECT seq, raw FROM messages WHERE seq < ? AND {UNEXPIRED}"
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
                "SELECT seq, raw FROM messages WHERE topic = ? AND seq <= ? AND seq > ?"
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
                f"SELECT seq, raw FROM messages WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?",
                [*args, limit + 1],
            )
            return rows[:limit], len(rows) > limit
        clauses = ["topic = ?", UNEXPIRED]
        args = [topic, now_ms()]
        if before_seq is not None:
            clauses.append("seq < ?")
            args.append(before_seq)
        rows = await self._rows(
            f"SELECT seq, raw FROM messages WHERE {' AND '.join(clauses)}"
            " ORDER BY seq DESC LIMIT ?",
            [*args, limit + 1],
        )
        return sorted(rows[:limit], key=lambda r: r.seq), len(rows) > limit

    async def origin_heads(self) -> list[tuple[str, int, int, list[int]]]:
        """Per origin: ``(origin, floor, head, above)`` where ``head`` is the end of the
        contiguous run of origin_seqs starting at the lowest held (``floor``), and
        ``above`` the seqs held beyond a hole (bounded) — the gossip tracker's start."""
        assert self._reader is not None
        rows = await self._reader.execute_fetchall(
            "WITH g AS (SELECT origin, origin_seq,"
            " origin_seq - ROW_NUMBER() OVER (PARTITION BY origin ORDER BY origin_seq) AS grp"
            " FROM messages),"
            " f AS (SELECT origin, MIN(grp) AS first FROM g GROUP BY origin)"
            " SELECT g.origin, MIN(g.origin_seq), MAX(g.origin_seq) FROM g JOIN f"
            " ON g.origin = f.origin AND g.grp = f.first GROUP BY g.origin"
        )
        firsts = {o: (lo, hi) for o, lo, hi in rows}
        rows = await self._reader.execute_fetchall(
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
        assert self._reader is not None
        rows = await self._reader.execute_fetchall(
            "SELECT raw FROM messages WHERE origin = ? AND origin_seq BETWEEN ? AND ?"
            " ORDER BY origin_seq LIMIT ?",
            (origin, first, last, max(0, limit)),
        )
        return [bytes(r[0]) for r in rows]

    # --- retention ----------------------------------------------------------------

    async def delete(self, seqs: list[int]) -> int:
        """Delete messages by seq (retention); keeps topic stats exact.

        Works in transactions of ``DELETE_CHUNK`` messages and lets queued commits run
        between them: one transaction for a whole pass held publishes for 100 ms or more
        at 2,000 messages/s.
        """
        if not seqs:
            return 0
        deleted = 0
        for i in range(0, len(seqs), DELETE_CHUNK):
            deleted += await self._delete_chunk(seqs[i : i + DELETE_CHUNK])
            await asyncio.sleep(0)  # let the flush loop take the write lock
        return deleted

    async def _delete_chunk(self, chunk: list[int]) -> int:
        assert self._writer is not None
        marks = ",".join("?" * len(chunk))
        origin_seq = str(self.origin_seq)

        def work(conn: sqlite3.Connection) -> list[tuple[str, int]]:
            # Our origin_seq counter must survive the deletion of our newest messages;
            # the commit path does not write it (open() reads it back from the log).
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('origin_seq', ?)",
                (origin_seq,),
            )
            rows = conn.execute(
                f"SELECT topic, size FROM messages WHERE seq IN ({marks})", chunk
            ).fetchall()
            conn.execute(f"DELETE FROM messages WHERE seq IN ({marks})", chunk)
            return rows

        try:
            async with self._write_lock:
                rows = await self._writer.run(lambda conn: _transaction(conn, lambda: work(conn)))
        except sqlite3.Error as exc:
            raise StorageError(f"retention could not delete: {exc}") from exc
        deleted = 0
        for topic, size in rows:
            stats = self.topics.get(topic)
            if stats is not None:
                stats.messages -= 1
                stats.bytes -= size
                if stats.messages <= 0:
                    del self.topics[topic]
            self.total_bytes -= size
            deleted += 1
        return deleted

    async def candidates(
        self, sql_where: str, args: list[Any], limit: int
    ) -> list[tuple[int, str, int]]:
        """``(seq, topic, ts)`` of rows matching a retention condition, oldest first."""
        assert self._reader is not None
        rows = await self._reader.execute_fetchall(
            f"SELECT seq, topic, ts FROM messages WHERE {sql_where} ORDER BY seq LIMIT ?",
            [*args, limit],
        )
        return [(int(s), str(t), int(ts)) for s, t, ts in rows]

    async def nth_newest_seq(self, topic: str, n: int) -> int | None:
        """The seq of the n-th newest message of a topic (1 = newest)."""
        assert self._reader is not None
        rows = list(
            await self._reader.execute_fetchall(
                "SELECT seq FROM messages WHERE topic = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
                (topic, n - 1),
            )
        )
        return int(rows[0][0]) if rows else None
