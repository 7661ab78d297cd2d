"""The log's commit job and retention deletes, run in the writer thread (spec §6.2-§6.4).

One job per batch: sign the local publishes (one batch signature per run of consecutive
``origin_seq``), drop peers' duplicates, number the rest, insert them (and the batch rows,
and the changed durable consumers), commit. A batch signed here is stored once in
``batches`` and its messages without ``sig`` (see :mod:`hearthnet.pubsub.logstore`): no
message's proof is made on the way in.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from typing import Any

from hearthnet.errors import HearthNetError
from hearthnet.identity import KeyPair
from hearthnet.pubsub.batchsig import SignedBatch
from hearthnet.pubsub.consumerstate import ConsumerRecord, ConsumerState, write_consumers
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.logstore import transaction

INSERT_ROWS = 256  # rows per INSERT statement (10 parameters each; SQLite allows 32,766)
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

# What became of one pending message in a commit: stored, a duplicate (None), or refused.
Outcome = StoredMessage | HearthNetError | None


@dataclass(slots=True)
class Pending:
    """A message waiting for its commit."""

    future: asyncio.Future[StoredMessage | None]
    message: Message | None  # None until a local publish is signed (in its commit job)
    local: bool = False  # our own publish (never a duplicate)
    source: str | None = None  # the peer a message came from
    unsigned: dict[str, Any] | None = None  # a local publish's fields before signing


def row_bytes(message: Message) -> bytes:
    """What the log stores of a message: a member of a batch signed here without ``sig``
    (its proof is made from the batch when read), any other the whole envelope."""
    if message.batch is not None:
        unsigned = message.unsigned_bytes()
        if unsigned is not None:
            return unsigned
    return message.raw


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


def sign_local(keys: KeyPair, batch: list[Pending]) -> dict[int, HearthNetError]:
    """Sign the batch's local publishes (in the writer thread), one batch signature per
    run of consecutive ``origin_seq`` (spec §6.2): a publish refused here (data the edge
    let through but JCS cannot sign) leaves its number unused and splits the run.
    Returns the refused publishes by position."""
    refused: dict[int, HearthNetError] = {}
    run: list[tuple[Pending, dict[str, Any], bytes]] = []

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


def write_batch(
    conn: sqlite3.Connection,
    keys: KeyPair,
    batch: list[Pending],
    *,
    head_seq: int,
    known: set[str],
    consumers: list[tuple[ConsumerRecord, ConsumerState]],
) -> list[Outcome]:
    """The commit job: sign our publishes (ed25519 runs without the GIL), drop peers'
    messages the log already holds, number the rest after ``head_seq``, insert them, their
    batches and the changed consumers, commit. Returns, per pending item, what was stored
    (None: a duplicate; an error: this publish failed alone)."""
    refused = sign_local(keys, batch)
    remote = [p.message.id for p in batch if p.message is not None and not p.local]
    if remote:
        known = known | _known_ids(conn, remote)
    results: list[Outcome] = []
    rows: list[Any] = []
    batches: dict[int, SignedBatch] = {}
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
        signed = msg.batch
        raw = row_bytes(msg)
        if signed is not None:
            batches[signed.first] = signed
        rows += (
            seq,
            msg.id,
            msg.topic,
            msg.origin,
            msg.origin_seq,
            msg.ts,
            msg.expires_ms,
            len(raw),
            raw,
            signed.first if signed is not None else None,
        )

    def work() -> None:
        # Many rows per statement: each statement step gives up and retakes the GIL,
        # which waits while the event loop is busy.
        if batches:
            conn.executemany(
                "INSERT OR IGNORE INTO batches (origin, first, n, root, sig, leaves)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (b.origin, b.first, b.n, b.root, b.signature, b"".join(b.leaves))
                    for b in batches.values()
                ],
            )
        step = INSERT_ROWS * 10
        for i in range(0, len(rows), step):
            chunk = rows[i : i + step]
            conn.execute(
                "INSERT INTO messages"
                " (seq, id, topic, origin, origin_seq, ts, expires_ms, size, raw, batch)"
                " VALUES " + ",".join([_ROW] * (len(chunk) // 10)),
                chunk,
            )
        write_consumers(conn, consumers)

    transaction(conn, work)
    return results


def delete_rows(
    conn: sqlite3.Connection, *, seqs: list[int], origin_seq: int
) -> list[tuple[str, int]]:
    """Delete messages by seq in one transaction (retention), and the batches none of whose
    messages is left; returns ``(topic, size)`` of each deleted row."""
    marks = ",".join("?" * len(seqs))

    def work() -> list[tuple[str, int]]:
        # Our origin_seq counter must survive the deletion of our newest messages;
        # the commit path does not write it (the log reads it back when it opens).
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('origin_seq', ?)",
            (str(origin_seq),),
        )
        rows = conn.execute(
            f"SELECT topic, size, origin, batch FROM messages WHERE seq IN ({marks})", seqs
        ).fetchall()
        conn.execute(f"DELETE FROM messages WHERE seq IN ({marks})", seqs)
        emptied = {(origin, first) for _, _, origin, first in rows if first is not None}
        if emptied:
            conn.executemany(
                "DELETE FROM batches WHERE origin = ? AND first = ? AND NOT EXISTS"
                " (SELECT 1 FROM messages m WHERE m.origin = batches.origin"
                " AND m.origin_seq >= batches.first AND m.origin_seq < batches.first + batches.n)",
                sorted(emptied),
            )
        return [(topic, size) for topic, size, _, _ in rows]

    return transaction(conn, work)
