"""Batches stored once (spec §6.2, §6.3): rows without sig, proofs made on read, schema 1
logs upgraded in place and read beside new rows, batches deleted with their last message."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import cbor2
import orjson

from hearthnet.pubsub.batchsig import BatchVerifier
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.wire import FORMS, EncodedMessage
from tests.pubsub.test_log import KEYS, PEER, opened, publish_many

# The log's schema before batches were stored once: every row holds its whole envelope.
SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, topic TEXT NOT NULL,
    origin TEXT NOT NULL, origin_seq INTEGER NOT NULL, ts INTEGER NOT NULL,
    expires_ms INTEGER, size INTEGER NOT NULL, raw BLOB NOT NULL
);
CREATE INDEX messages_topic ON messages (topic, seq);
CREATE INDEX messages_origin ON messages (origin, origin_seq);
CREATE INDEX messages_ts ON messages (ts);
CREATE TABLE consumers (
    identity TEXT NOT NULL, name TEXT NOT NULL, patterns TEXT NOT NULL,
    cursor INTEGER NOT NULL, lost_from INTEGER, lost_to INTEGER, updated_ms INTEGER NOT NULL,
    PRIMARY KEY (identity, name)
);
INSERT INTO meta VALUES ('epoch', '00112233aabbccdd');
"""


def verified(raw: bytes) -> Message:
    """The envelope parsed with a verifier of its own (every signature checked)."""
    return Message.parse(orjson.loads(raw), raw=raw, verifier=BatchVerifier())


def ws_payload(frame: bytes) -> bytes:
    """The payload of one unmasked WebSocket frame."""
    length = frame[1] & 0x7F
    return frame[{126: 4, 127: 10}.get(length, 2) :]


def schema_1_log(path: Path) -> list[bytes]:
    """A log as schema 1 wrote it: our message signed alone, then a batch of three of ours
    with their proofs in each row, then a peer's; returns the stored envelopes."""
    bodies = [
        Message.unsigned(
            KEYS.node_id, topic="chat.a", msg_type="m", data={"i": i}, origin_seq=i, ts=1000 + i
        )
        for i in range(1, 5)
    ]
    alone = Message.signed(KEYS, bodies[0])
    batch = Message.signed_batch(KEYS, bodies[1:], [canonical_body(b) for b in bodies[1:]])
    peer = Message.create(PEER, topic="chat.a", msg_type="m", data="p", origin_seq=1, ts=1005)
    messages = [alone, *batch, peer]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(SCHEMA_1)
        conn.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (seq, m.id, m.topic, m.origin, m.origin_seq, m.ts, None, len(m.raw), m.raw)
                for seq, m in enumerate(messages, 1)
            ],
        )
        conn.commit()
    return [m.raw for m in messages]


async def test_a_batch_is_stored_once_and_its_messages_without_sig(tmp_path: Path) -> None:
    """Ten publishes committed together: one batches row, ten rows without sig, and what
    history reads back (its proof made from the batch) is the same envelope fan-out got,
    and verifies."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        sent: list[StoredMessage] = []
        log.listeners.append(sent.extend)
        await publish_many(log, 10)
        fanned_out = [s.message.raw for s in sent]
        read, _ = await log.history("chat.a", limit=50)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        batches = conn.execute("SELECT origin, first, n, length(leaves) FROM batches").fetchall()
        rows = conn.execute("SELECT raw, batch FROM messages ORDER BY seq").fetchall()
    assert (
        [(KEYS.node_id, 1, 10, 320)],
        [(False, 1)] * 10,
        fanned_out,
        [{"i": i} for i in range(10)],
    ) == (
        batches,
        [(b'"sig"' in raw, first) for raw, first in rows],
        [r.message.raw for r in read],
        [verified(r.message.raw).data for r in read],
    )


async def test_a_schema_1_log_is_upgraded_in_place_and_read_beside_new_rows(
    tmp_path: Path,
) -> None:
    """A log written by schema 1 opens: its rows read back byte for byte, our origin_seq
    goes on from them, new publishes are stored as a batch, and after a restart history,
    gossip repair and the unsigned form serve both kinds, every envelope verifying."""
    path = tmp_path / "log.db"
    old = schema_1_log(path)
    async with opened(path) as log:
        new = [s.message.raw for s in await publish_many(log, 3)]
    async with opened(path) as log:
        epoch, head = log.epoch, log.head_seq
        read, _ = await log.history("chat.a", limit=50)
        repaired = await log.read_origin(KEYS.node_id, 1, 100, 100)
        unsigned = [r.message.unsigned_bytes() or b"" for r in read]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        kinds = conn.execute("SELECT batch FROM messages ORDER BY seq").fetchall()
        schema = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    everything = [*old, *new]
    assert (
        ("00112233aabbccdd", 8, ("2",)),
        [None] * 5 + [5] * 3,
        everything,
        [m for m in everything if verified(m).origin == KEYS.node_id],
        [1, 2, 3, 4, 5, 6, 7],
        [b'"sig"' in u for u in unsigned],
    ) == (
        (epoch, head, schema),
        [k for (k,) in kinds],
        [r.message.raw for r in read],
        repaired,
        [verified(m).origin_seq for m in repaired],
        [False] * 8,
    )


async def test_a_batch_goes_with_its_last_message(tmp_path: Path) -> None:
    """Retention that deletes part of a batch keeps the batch (the rest still needs its
    proofs); deleting the last of its messages deletes it."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        await publish_many(log, 4)
        await log.delete([1, 2, 3])
        with contextlib.closing(sqlite3.connect(path)) as conn:
            kept = conn.execute("SELECT first, n FROM batches").fetchall()
        last, _ = await log.history("chat.a", limit=50)
        await log.delete([4])
        with contextlib.closing(sqlite3.connect(path)) as conn:
            gone = conn.execute("SELECT first, n FROM batches").fetchall()
    assert ([(1, 4)], [4], []) == (kept, [verified(r.message.raw).origin_seq for r in last], gone)


async def test_a_commit_retried_alone_keeps_each_message_provable(tmp_path: Path) -> None:
    """A batch whose transaction fails is written again one message at a time: each row
    that commits still has its batch, and reads back verifying."""
    path = tmp_path / "log.db"
    body = Message.unsigned(
        PEER.node_id, topic="chat.a", msg_type="m", data={}, origin_seq=2**64, ts=1
    )
    unstorable = Message.trusted({**body, "sig": "ed25519:x"}, b"{}")
    log = MessageLog(path, KEYS, synchronous="normal")
    await log.open()
    try:
        futures = [
            log.publish(topic="chat.a", msg_type="m", data={"i": 0}),
            log.ingest(unstorable, source=PEER.node_id),
            log.publish(topic="chat.a", msg_type="m", data={"i": 1}),
        ]
    finally:
        await log.close()  # flushes what is queued
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    async with opened(path) as log:
        read, _ = await log.history("chat.a", limit=50)
    assert ([1, "internal_error", 2], [{"i": 0}, {"i": 1}]) == (
        [o.seq if isinstance(o, StoredMessage) else getattr(o, "code", o) for o in outcomes],
        [verified(r.message.raw).data for r in read],
    )


async def test_unsigned_frames_never_make_a_proof(tmp_path: Path) -> None:
    """Every unsigned form of a batch member (what subscribers that do not verify get)
    is made without its proof, and equals the signed form without sig."""
    async with opened(tmp_path / "log.db") as log:
        stored = await publish_many(log, 3)
        read, _ = await log.history("chat.a", limit=50)
    items = [EncodedMessage(s) for s in [*stored, *read]]
    unsigned = {name: [item.unsigned(name) for item in items] for name in FORMS}
    sealed_before = [item.stored.message.sealed for item in items]
    cbor = [cbor2.loads(ws_payload(frame))["data"] for frame in unsigned["ws_cbor"]]
    expected = [item.stored.message.body() for item in items]
    for body in expected:
        del body["sig"]
    assert ([False] * 6, expected) == (sealed_before, cbor)
