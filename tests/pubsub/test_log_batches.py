"""Batches stored once (spec §6.2, §6.3): one row per committed batch, bodies without sig,
proofs made on read, schema 1 and 2 logs upgraded in place and read beside new rows,
gossiped batches stored whole, batches rewritten or deleted by retention."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import cbor2
import orjson

from hearthnet.clock import now_ms
from hearthnet.mesh.batches import batch_frame, parse_leaves, prove_batch, repair_frames
from hearthnet.pubsub.batchsig import BatchVerifier
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body, unsigned_fields
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.logcommit import Group, Pending, write_batch
from hearthnet.pubsub.logstore import unpack_heads
from hearthnet.pubsub.topics import TopicPattern
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
    """Ten publishes committed together: one batches row holding ten bodies without sig,
    and what history reads back (its proof made from the batch) is the same envelope
    fan-out got, and verifies."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        sent: list[StoredMessage] = []
        log.listeners.append(sent.extend)
        await publish_many(log, 10)
        fanned_out = [s.message.raw for s in sent]
        read, _ = await log.reader.history("chat.a", limit=50)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        batches = conn.execute("SELECT origin, first, n, length(leaves) FROM batches").fetchall()
        rows = conn.execute("SELECT bodies, heads FROM batches").fetchall()
    assert (
        [(KEYS.node_id, 1, 10, 320)],
        [(False, 10)],
        fanned_out,
        [{"i": i} for i in range(10)],
    ) == (
        batches,
        [(b'"sig"' in bodies, len(orjson.loads(heads))) for bodies, heads in rows],
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
        read, _ = await log.reader.history("chat.a", limit=50)
        repaired = await log.reader.read_origin(KEYS.node_id, 1, 100, 100)
        unsigned = [r.message.unsigned_bytes() or b"" for r in read]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        kinds = conn.execute("SELECT seq, origin, first FROM batches ORDER BY seq").fetchall()
        schema = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    everything = [*old, *new]
    assert (
        ("00112233aabbccdd", 8, ("3",)),
        [(1, "", 0), (6, KEYS.node_id, 5)],
        everything,
        [m for m in everything if verified(m).origin == KEYS.node_id],
        [1, 2, 3, 4, 5, 6, 7],
        [b'"sig"' in u for u in unsigned],
    ) == (
        (epoch, head, schema),
        kinds,
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
        last, _ = await log.reader.history("chat.a", limit=50)
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
        read, _ = await log.reader.history("chat.a", limit=50)
    assert ([1, "internal_error", 2], [{"i": 0}, {"i": 1}]) == (
        [o.seq if isinstance(o, StoredMessage) else getattr(o, "code", o) for o in outcomes],
        [verified(r.message.raw).data for r in read],
    )


async def test_unsigned_frames_never_make_a_proof(tmp_path: Path) -> None:
    """Every unsigned form of a batch member (what subscribers that do not verify get)
    is made without its proof, and equals the signed form without sig."""
    async with opened(tmp_path / "log.db") as log:
        stored = await publish_many(log, 3)
        read, _ = await log.reader.history("chat.a", limit=50)
    items = [EncodedMessage(s) for s in [*stored, *read]]
    unsigned = {name: [item.unsigned(name) for item in items] for name in FORMS}
    sealed_before = [item.stored.message.sealed for item in items]
    cbor = [cbor2.loads(ws_payload(frame))["data"] for frame in unsigned["ws_cbor"]]
    expected = [item.stored.message.body() for item in items]
    for body in expected:
        del body["sig"]
    assert ([False] * 6, expected) == (sealed_before, cbor)


async def test_a_commit_makes_no_message_until_one_is_read(tmp_path: Path) -> None:
    """Our batch reaches the commit listeners as fields and bytes (no Message made, not
    even by JSON fan-out without sig or by a topic and origin lookup); the Message made
    on first use carries the same envelope history reads back."""
    async with opened(tmp_path / "log.db") as log:
        sent: list[StoredMessage] = []
        log.listeners.append(sent.extend)
        await publish_many(log, 4)
        items = [EncodedMessage(s) for s in sent]
        frames = [item.unsigned("ws_text") + item.unsigned("sse") for item in items]
        looked_up = [(s.topic, s.origin, s.origin_seq) for s in sent]
        lazy = [s.fields is not None and s.batch is not None for s in sent]
        read, _ = await log.reader.history("chat.a", limit=50)
    assert (
        [True] * 4,
        [("chat.a", KEYS.node_id, i) for i in range(1, 5)],
        [EncodedMessage(r).unsigned("ws_text") + EncodedMessage(r).unsigned("sse") for r in read],
        [r.message.raw for r in read],
    ) == (lazy, looked_up, frames, [s.message.raw for s in sent])


FIXTURE = Path(__file__).parent.parent / "fixtures" / "pubsub"


def _expired(body: dict[str, Any]) -> bool:
    """Whether a stored message's ttl has run out by now."""
    ttl_s = body.get("ttl_s")
    return ttl_s is not None and int(body["ts"]) + int(ttl_s) * 1000 <= now_ms()


async def test_a_schema_2_log_is_upgraded_in_place(tmp_path: Path) -> None:
    """A log written by schema 2 (a row per message, batch members without sig) opens as
    one row per batch: every message reads back byte for byte and verifies, the
    consumer and the counters are kept, and new publishes number on."""
    path = tmp_path / "log.sqlite3"
    path.write_bytes((FIXTURE / "log_schema2.sqlite3").read_bytes())
    written = orjson.loads((FIXTURE / "log_schema2.json").read_bytes())["messages"]
    # The fixture's one message with a ttl expired an hour after it was written: it is
    # kept on disk but no longer served.
    expected = [(seq, raw) for seq, raw in written if not _expired(orjson.loads(raw))]
    async with opened(path) as log:
        every = await log.reader.read_matching(
            [TopicPattern.parse("**")], after_seq=0, upto_seq=log.head_seq, limit=100
        )
        new = await publish_many(log, 1)
        consumer = log.consumers.get(("tok", "c1"))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT seq, origin <> '', n FROM batches ORDER BY seq").fetchall()
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert (
        [(seq, raw.encode()) for seq, raw in expected],
        (12, 11),
        3,
        [(1, 1, 5), (6, 0, 0), (8, 1, 3), (11, 0, 0), (12, 0, 0)],
        {"meta", "batches", "consumers", "origin_floors"},
    ) == (
        [(s.seq, verified(s.message.raw).raw) for s in every],
        (new[0].seq, new[0].message.origin_seq),
        consumer.cursor if consumer else None,
        rows,
        {name for (name,) in tables},
    )


async def test_a_gossiped_batch_is_stored_as_one_row_and_served_whole(tmp_path: Path) -> None:
    """A peer's batch, verified whole, is one row with its leaves: after a restart its
    messages read back with the origin's proofs, and repair serves them as the same
    batch frame."""
    bodies = [
        Message.unsigned(
            PEER.node_id, topic="chat.p", msg_type="m", data=i, origin_seq=i, ts=2000 + i
        )
        for i in range(1, 5)
    ]
    signed = Message.signed_batch(PEER, bodies, [canonical_body(b) for b in bodies])
    frame = batch_frame(signed, 1)
    received = prove_batch(frame, parse_leaves(frame), BatchVerifier())
    path = tmp_path / "log.db"
    async with opened(path) as log:
        await asyncio.gather(*(log.ingest(m, source=PEER.node_id) for m in received))
    async with opened(path) as log:
        read, _ = await log.reader.history("chat.p", limit=50)
        repaired = await log.reader.read_origin(PEER.node_id, 1, 4, 10)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT origin, first, n FROM batches").fetchall()
    assert (
        [(PEER.node_id, 1, 4)],
        [m.raw for m in signed],
        [frame.encode()],
    ) == (
        rows,
        [verified(r.message.raw).raw for r in read],
        repair_frames(repaired, True),
    )


async def test_retention_rewrites_a_partly_expired_batch(tmp_path: Path) -> None:
    """Deleting the middle of a batch rewrites its row: the rest stays provable, and a
    restart rebuilds the indexes from the rewritten row."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        await publish_many(log, 5)
        assert 2 == await log.delete([2, 4])
    async with opened(path) as log:
        read, _ = await log.reader.history("chat.a", limit=50)
        stats = log.topics["chat.a"].messages
        knows = [log.knows(r.message.id) for r in read]
    assert ([1, 3, 5], 3, [True] * 3) == (
        [verified(r.message.raw).origin_seq for r in read],
        stats,
        knows,
    )


def _masked_row(conn: sqlite3.Connection, ids: list[str]) -> tuple[Any, ...]:
    """The one batches row without what two commits of the same publishes cannot share:
    the message ids (in the headers and the bodies) and what hashes them (root, leaves,
    sig: only their sizes)."""
    seq, origin, first, n, heads, root, sig, leaves, bodies = conn.execute(
        "SELECT seq, origin, first, n, heads, root, sig, leaves, bodies FROM batches"
    ).fetchall()[0]
    for message_id in ids:
        bodies = bodies.replace(message_id.encode(), b"ID")
    return (
        seq,
        origin,
        first,
        n,
        [h._replace(id="ID") for h in unpack_heads(heads, origin)],
        len(root),
        len(sig),
        len(leaves),
        bodies,
    )


async def test_a_group_of_usual_publishes_is_stored_as_the_general_job_stores_it(
    tmp_path: Path,
) -> None:
    """publish_many's usual group (one ts, no ttl_s: committed by logrun.write_run) makes
    the row the general commit job makes of the same bodies, and answers the same; both
    read back verifying. One publish JCS cannot sign in such a group fails alone."""
    sender = {"kind": "node", "id": KEYS.node_id}
    made: list[tuple[Any, ...]] = []
    answers: list[list[tuple[int, int]]] = []
    for name in ("run", "general"):
        bodies = [
            unsigned_fields(KEYS.node_id, "chat.a", "m", {"i": i}, i + 1, 1000, None, sender, "")
            for i in range(5)
        ]
        path = tmp_path / f"{name}.db"
        async with opened(path) as log:
            entry = Pending(None, bodies=bodies, group=Group(5), ts=1000 if name == "run" else None)
            log.sequencer.origin_seq = log.origin_seq = 5
            assert log._writer is not None
            outcomes, _ = await log._writer.run(
                lambda conn, entry=entry: write_batch(  # type: ignore[misc]
                    conn, KEYS, [entry], sequencer=log.sequencer, consumers=[]
                )
            )
        with contextlib.closing(sqlite3.connect(path)) as conn:
            made.append(_masked_row(conn, [b["id"] for b in bodies]))
        stored = [o for o in outcomes if isinstance(o, StoredMessage)]
        answers.append([(s.seq, verified(s.message.raw).origin_seq) for s in stored])
    async with opened(tmp_path / "mixed.db") as log:
        items = [("chat.a", "m", data, None, None) for data in ({"i": 0}, 2**53 + 1, {"i": 2})]
        mixed = await log.publish_many(items)
        read, _ = await log.reader.history("chat.a", limit=10)
    assert (
        made[1],
        [(i, i) for i in range(1, 6)],
        answers[0],
        [1, "bad_request", 2],
        [{"i": 0}, {"i": 2}],
    ) == (
        made[0],
        answers[0],
        answers[1],
        [o.seq if isinstance(o, StoredMessage) else getattr(o, "code", o) for o in mixed],
        [verified(r.message.raw).data for r in read],
    )


async def test_retention_cuts_run_rows_and_a_reopened_log_reads_them(tmp_path: Path) -> None:
    """Rows of groups (their headers in the run form): retention deletes a prefix that
    ends inside one and single messages of another, the cut rows are rewritten (array
    form), and the log reopened rebuilds its indexes from both forms (a third row kept
    whole); what is left reads back verifying."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        for topic in ("chat.a", "chat.b", "chat.c"):
            items = [(topic, "m", {"i": i}, None, None) for i in range(6)]
            outcomes = await log.publish_many(items)
            assert all(isinstance(o, StoredMessage) for o in outcomes)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            forms = [type(orjson.loads(h)) for (h,) in conn.execute("SELECT heads FROM batches")]
        await log.delete(before_seq=4)
        await log.delete([8, 12])
    async with opened(path) as log:
        kept: dict[str, list[int]] = {}
        for topic in ("chat.a", "chat.b", "chat.c"):
            read, _ = await log.reader.history(topic, limit=50)
            kept[topic] = [verified(r.message.raw).data["i"] for r in read]
        counts = (log.head_seq, *[log.topics[t].messages for t in ("chat.a", "chat.b", "chat.c")])
    left = {"chat.a": [3, 4, 5], "chat.b": [0, 2, 3, 4], "chat.c": list(range(6))}
    assert ([dict] * 3, left, (18, 3, 4, 6)) == (
        forms,
        kept,
        counts,
    )
