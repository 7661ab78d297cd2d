"""The usual commit job: one run of our publishes queued together (spec §6.2-§6.4).

What :meth:`MessageLog.publish_many <hearthnet.pubsub.log.MessageLog.publish_many>`
queues (a WebSocket session's publishes of a loop turn, a batch of a client) is one run
of bodies with one ``ts``, no ``ttl_s`` and consecutive ``origin_seq``. Such a commit
needs no numbering pass and no search for runs: its ids are given at once, its
canonical bytes make one batch (one ed25519 signature), and its row's headers are
columns made from ranges and repeats, with one pass over the bodies for their topics.
The general job (:func:`hearthnet.pubsub.logcommit.write_batch`) does the same for any
batch, with a pass per column; both store the same row.
"""

from __future__ import annotations

import sqlite3
from itertools import repeat
from operator import itemgetter
from typing import Any

import orjson

from hearthnet.errors import HearthNetError
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid, new_ulids
from hearthnet.pubsub.batchsig import SignedBatch
from hearthnet.pubsub.consumerstate import ConsumerRecord, ConsumerState, write_consumers
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.envelope_fields import with_sig
from hearthnet.pubsub.logstore import INSERT_ROW, HeadColumns, Row, pack_run, transaction
from hearthnet.pubsub.merkle import hash_leaves

_TOPIC = itemgetter("topic")


def write_run(  # noqa: PLR0917 - called once per commit, positionally
    conn: sqlite3.Connection,
    keys: KeyPair,
    bodies: list[dict[str, Any]],
    ts: int | None,
    seq: int,
    consumers: list[tuple[ConsumerRecord, ConsumerState]],
) -> tuple[list[StoredMessage], Row] | None:
    """Commit ``bodies``, our publishes queued together (every one of time ``ts``,
    without ``ttl_s``, their ``origin_seq`` consecutive; ``ts`` None: not such a run),
    numbered from ``seq``: their ids given, one batch signed, one row inserted with the
    changed consumers. One publish alone (one in flight, any ``ts``) is
    :func:`write_one`'s. Returns what was stored, in order, and the row; None, with
    nothing written, for no body, a run given its ids already (a commit tried before),
    or one with a body that cannot be signed as it is (the general job then refuses it
    alone; the ids given here stay theirs)."""
    n = len(bodies)
    if n == 1:
        return write_one(conn, keys, bodies[0], seq, consumers)
    if ts is None or n < 2 or bodies[0]["id"]:
        return None
    ids = new_ulids([ts] * n)
    for body, message_id in zip(bodies, ids, strict=True):
        body["id"] = message_id
    try:
        leaves = list(map(canonical_body, bodies))
    except HearthNetError:
        return None
    first = bodies[0]["origin_seq"]
    batch = SignedBatch.sign(keys, first, hash_leaves(leaves))
    seqs = range(seq, seq + n)
    stored = list(map(StoredMessage.of_batch, seqs, bodies, leaves, repeat(batch, n)))
    hashes = b"".join(batch.leaves)
    row = Row(seq, batch.origin, first, n, [], leaves, batch.root, batch.signature, hashes)
    topics, sizes = list(map(_TOPIC, bodies)), list(map(len, leaves))
    row.cols = HeadColumns(
        seqs, ids, topics, [batch.origin] * n, range(first, first + n), [ts] * n, [None] * n, sizes
    )
    params = (
        seq,
        batch.origin,
        first,
        n,
        pack_run(seq, first, ts, topics, ids, sizes),
        batch.root,
        batch.signature,
        hashes,
        b"".join(leaves),
    )
    store_row(conn, params, consumers)
    return stored, row


def write_one(
    conn: sqlite3.Connection,
    keys: KeyPair,
    body: dict[str, Any],
    seq: int,
    consumers: list[tuple[ConsumerRecord, ConsumerState]],
) -> tuple[list[StoredMessage], Row] | None:
    """Commit ``body``, one publish of ours queued alone (one in flight), at ``seq``: its
    id given, signed alone, one row of its whole envelope inserted with the changed
    consumers. The row and message the general job makes of it (``sign_local``, then
    ``_write_lone``) without its lists, its runs and its pass over the columns. None, with
    nothing written, for a body given its id already (a commit tried before) or one that
    cannot be signed as it is (the general job then refuses it; its id stays)."""
    if body["id"]:
        return None
    body["id"] = message_id = new_ulid(body["ts"])
    try:
        leaf = canonical_body(body)
    except HearthNetError:
        return None
    signature = keys.sign_bytes(leaf)
    raw = with_sig(leaf, signature)
    # The body stays without sig: a commit that fails is tried again from it.
    message = Message.trusted({**body, "sig": signature}, raw, len(leaf) - 1)
    topic, origin, origin_seq, ts = message.topic, message.origin, message.origin_seq, message.ts
    expires, size = message.expires_ms, len(raw)
    row = Row(seq, "", 0, 0, [], [raw])
    row.cols = HeadColumns(
        (seq,), (message_id,), (topic,), (origin,), (origin_seq,), (ts,), (expires,), (size,)
    )
    # Row.params of that row: the heads column as pack_columns encodes one message.
    heads = orjson.dumps([(seq, message_id, topic, origin, origin_seq, ts, expires, size)])
    store_row(conn, (seq, "", 0, 0, heads, None, None, None, raw), consumers)
    return [StoredMessage(seq, message)], row


def store_row(
    conn: sqlite3.Connection,
    params: tuple[Any, ...],
    consumers: list[tuple[ConsumerRecord, ConsumerState]],
) -> None:
    """One row, and the changed consumers' records with it in one transaction. With no
    consumer one statement: in autocommit mode the INSERT is its own transaction, as
    durable as BEGIN .. COMMIT around it (two statements fewer)."""
    if consumers:

        def work() -> None:
            conn.execute(INSERT_ROW, params)
            write_consumers(conn, consumers)

        transaction(conn, work)
    else:
        conn.execute(INSERT_ROW, params)
