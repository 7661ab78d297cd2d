"""The log's commit job and retention deletes, run in the writer thread (spec §6.2-§6.4).

One job per batch: sign the local publishes (one batch signature per run of consecutive
``origin_seq``), drop peers' duplicates and number the rest (the
:class:`~hearthnet.pubsub.sequencer.Sequencer`, read only here), insert one row per signed
batch and one per run of whole envelopes (see :mod:`hearthnet.pubsub.logstore`) and the
changed durable consumers, commit. No message's proof is made on the way in.

Retention deletes whole rows, or rewrites a row that keeps some of its messages: the
kept headers and bodies are written back with the batch's signature and leaf hashes
unchanged, so every kept message stays provable.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hearthnet.errors import HearthNetError
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulids
from hearthnet.pubsub.batchsig import SignedBatch
from hearthnet.pubsub.consumerstate import ConsumerRecord, ConsumerState, write_consumers
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.logindex import Head
from hearthnet.pubsub.logstore import (
    INSERT_ROW,
    Row,
    pack_heads,
    split_bodies,
    transaction,
    unpack_heads,
)
from hearthnet.pubsub.merkle import HASH_BYTES, leaf_hash
from hearthnet.pubsub.sequencer import Sequencer

log = logging.getLogger("hearthnet.pubsub.log")

# What became of one pending message in a commit: stored, a duplicate (None), or refused.
Outcome = StoredMessage | HearthNetError | None
# Told a publish's outcome in the loop turn that decides it (no future, no callback turn).
Answer = Callable[[Outcome], None]


@dataclass(slots=True)
class Group:
    """One future for several publishes: resolves, once each is committed or refused, to
    their outcomes in order."""

    future: asyncio.Future[list[Outcome]]
    outcomes: list[Outcome]
    left: int


@dataclass(slots=True)
class Pending:
    """A message waiting for its commit."""

    future: asyncio.Future[StoredMessage | None] | None  # None: ``group`` or ``notify``
    message: Message | None  # None until a local publish is signed (in its commit job)
    local: bool = False  # our own publish (never a duplicate)
    source: str | None = None  # the peer a message came from
    unsigned: dict[str, Any] | None = None  # a local publish's fields before signing
    group: Group | None = None
    slot: int = 0  # its place in ``group``
    notify: Answer | None = None  # called with the outcome instead of a future

    def answer(self, outcome: Outcome) -> None:
        """Resolve this message's future (or its place in its group) with ``outcome``,
        or tell ``notify`` at once; an error fails the future. Once only."""
        notify = self.notify
        if notify is not None:
            self.notify = None
            try:
                notify(outcome)
            except Exception:  # the commit stands; the other publishers are answered
                log.exception("a publish's answer failed")
            return
        group = self.group
        if group is not None:
            if group.outcomes[self.slot] is UNANSWERED:
                group.outcomes[self.slot] = outcome
                group.left -= 1
                if not group.left and not group.future.done():
                    group.future.set_result(group.outcomes)
            return
        future = self.future
        if future is None or future.done():
            return
        if isinstance(outcome, HearthNetError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


# A group's place not answered yet (an error nobody raises: never an outcome).
UNANSWERED: Outcome = HearthNetError("unanswered")


# A local publish signed in a batch: its canonical bytes without ``sig`` and the batch.
Signed = tuple[bytes, SignedBatch]


def sign_local(
    keys: KeyPair, batch: list[Pending]
) -> tuple[dict[int, HearthNetError], list[Signed | None]]:
    """Sign the batch's local publishes (in the writer thread), one batch signature per
    run of consecutive ``origin_seq`` (spec §6.2): a publish refused here (data the edge
    let through but JCS cannot sign) leaves its number unused and splits the run.
    Returns the refused publishes by position, and per position the canonical bytes and
    batch of each publish signed in a batch (no :class:`Message` is made: see
    :meth:`StoredMessage.of_batch`); a run of one is signed alone and gets its
    ``Message`` (``pending.message``)."""
    refused: dict[int, HearthNetError] = {}
    signed: list[Signed | None] = [None] * len(batch)
    fresh: list[dict[str, Any]] = [
        p.unsigned for p in batch if p.unsigned is not None and not p.unsigned["id"]
    ]
    if fresh:  # queued without an id: given here, at once, in origin_seq order
        for new, message_id in zip(fresh, new_ulids([f["ts"] for f in fresh]), strict=True):
            new["id"] = message_id
    at: list[int] = []  # the positions of the run being gathered
    leaves: list[bytes] = []
    first = next_seq = 0

    def close_run() -> None:
        if len(at) == 1:
            pending = batch[at[0]]
            assert pending.unsigned is not None
            pending.message = Message.signed_batch(keys, [pending.unsigned], leaves)[0]
            pending.unsigned = None
        elif at:
            signature = SignedBatch.sign(keys, first, [leaf_hash(leaf) for leaf in leaves])
            for i, leaf in zip(at, leaves, strict=True):
                signed[i] = (leaf, signature)
        at.clear()
        leaves.clear()

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
        origin_seq = body["origin_seq"]
        if at and origin_seq != next_seq:
            close_run()
        if not at:
            first = origin_seq
        next_seq = origin_seq + 1
        at.append(i)
        leaves.append(leaf)
    close_run()
    return refused, signed


def _row_for(seq: int, batch: SignedBatch | None) -> Row:
    """A new row starting at ``seq`` (of ``batch``, or of whole envelopes)."""
    if batch is None:
        return Row(seq, "", 0, 0, [], [])
    return Row(
        seq,
        batch.origin,
        batch.first,
        batch.n,
        [],
        [],
        batch.root,
        batch.signature,
        b"".join(batch.leaves),
    )


def _batch_run(items: list[StoredMessage], fields: list[dict[str, Any]]) -> list[Head]:
    """The headers of messages committed by :meth:`StoredMessage.of_batch` (ours, of one
    batch; ``fields`` theirs), made from their fields' columns."""
    ts = [f["ts"] for f in fields]
    ttls = [f.get("ttl_s") for f in fields]
    expires = (
        ttls
        if ttls.count(None) == len(ttls)
        else [t + ttl * 1000 if ttl is not None else None for t, ttl in zip(ts, ttls, strict=True)]
    )
    return list(
        map(
            Head._make,
            zip(
                [item.seq for item in items],
                [f["id"] for f in fields],
                [f["topic"] for f in fields],
                [f["origin"] for f in fields],
                [f["origin_seq"] for f in fields],
                ts,
                expires,
                [len(item.leaf) for item in items],
                strict=True,
            ),
        )
    )


def rows_of(stored: list[StoredMessage]) -> list[Row]:
    """A commit's messages (seq order) as rows: each run of one signed batch held whole
    (its leaves known: signed here, or gossiped whole) is a row of bodies without ``sig``,
    each run of anything else a row of whole envelopes."""
    rows: list[Row] = []
    row: Row | None = None
    i, n = 0, len(stored)
    while i < n:
        item = stored[i]
        if item.fields is not None:  # ours, signed in this commit: no Message made
            batch = item.batch
            assert batch is not None
            j = i + batch.n  # a batch signed in this commit: its messages in a row
            run = stored[i:j]
            fields = [s.fields for s in run]
            if len(run) != batch.n or None in fields or run[-1].batch is not batch:
                j = i + 1  # not the usual run: one at a time
                run, fields = [item], [item.fields]
            row = _row_for(item.seq, batch)
            row.heads = _batch_run(run, fields)  # type: ignore[arg-type]
            row.bodies = [s.leaf for s in run]
            rows.append(row)
            row = None  # the next message starts a row of its own
            i = j
            continue
        msg = item.message
        batch = msg.batch
        unsigned = msg.unsigned_bytes() if batch is not None else None
        if unsigned is None:
            batch = None  # no bytes without sig at hand: stored whole
        body = unsigned if unsigned is not None else msg.raw
        if row is None or (row.origin, row.first, row.sig) != (
            (batch.origin, batch.first, batch.signature) if batch else ("", 0, None)
        ):
            row = _row_for(item.seq, batch)
            rows.append(row)
        row.heads.append(
            Head(
                item.seq,
                msg.id,
                msg.topic,
                msg.origin,
                msg.origin_seq,
                msg.ts,
                msg.expires_ms,
                len(body),
            )
        )
        row.bodies.append(body)
        i += 1
    return rows


def write_batch(
    conn: sqlite3.Connection,
    keys: KeyPair,
    batch: list[Pending],
    *,
    sequencer: Sequencer,
    consumers: list[tuple[ConsumerRecord, ConsumerState]],
) -> tuple[list[Outcome], list[Row]]:
    """The commit job: sign our publishes (ed25519 runs without the GIL), number the
    batch (peers' messages the log holds take no number), insert its rows and the changed
    consumers, commit. Returns, per pending item, what was stored (None: a duplicate; an
    error: this publish failed alone), and the rows written."""
    refused, signed = sign_local(keys, batch)
    numbered = sequencer.number(
        [
            (p.message.id, p.local)
            if p.message is not None
            else (p.unsigned["id"], True)
            if s is not None and p.unsigned is not None
            else None
            for p, s in zip(batch, signed, strict=True)
        ]
    )
    results: list[Outcome] = []
    stored: list[StoredMessage] = []
    of_batch = StoredMessage.of_batch
    for i, (pending, seq) in enumerate(zip(batch, numbered, strict=True)):
        done = signed[i]
        if done is not None and seq is not None:
            assert pending.unsigned is not None
            item = of_batch(seq, pending.unsigned, done[0], done[1])
            results.append(item)
            stored.append(item)
            continue
        msg = pending.message
        if msg is None:
            results.append(refused[i])
            continue
        if seq is None:
            results.append(None)
            continue
        item = StoredMessage(seq, msg, pending.source)
        results.append(item)
        stored.append(item)
    rows = rows_of(stored)

    def work() -> None:
        conn.executemany(INSERT_ROW, [row.params() for row in rows])
        write_consumers(conn, consumers)

    transaction(conn, work)
    return results, rows


def delete_rows(
    conn: sqlite3.Connection, *, doomed: dict[int, set[int]], origin_seq: int, head_seq: int
) -> tuple[list[Head], list[int]]:
    """Delete messages (retention) in one transaction: ``doomed`` maps a row's key to the
    seqs to delete from it. A row left empty is deleted; a row that keeps some messages
    is rewritten with their headers and bodies (its batch's signature and leaves
    unchanged). Returns the deleted headers and the keys of the rows deleted."""

    def work() -> tuple[list[Head], list[int]]:
        # The counters must survive the deletion of the newest messages; the commit
        # path does not write them (the log reads them back when it opens).
        conn.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [("origin_seq", str(origin_seq)), ("head_seq", str(head_seq))],
        )
        gone: list[Head] = []
        emptied: list[int] = []
        for key, seqs in sorted(doomed.items()):
            found = conn.execute(
                "SELECT origin, heads, bodies FROM batches WHERE seq = ?", (key,)
            ).fetchone()
            if found is None:
                continue
            origin, heads_blob, bodies_blob = found
            heads = unpack_heads(heads_blob, origin)
            bodies = split_bodies(heads, bodies_blob)
            kept = [(h, b) for h, b in zip(heads, bodies, strict=True) if h.seq not in seqs]
            gone += [h for h in heads if h.seq in seqs]
            if not kept:
                conn.execute("DELETE FROM batches WHERE seq = ?", (key,))
                emptied.append(key)
            elif len(kept) < len(heads):
                conn.execute(
                    "UPDATE batches SET heads = ?, bodies = ? WHERE seq = ?",
                    (pack_heads([h for h, _ in kept], origin), b"".join(b for _, b in kept), key),
                )
        return gone, emptied

    return transaction(conn, work)


def leaf_hashes(leaves: bytes) -> list[bytes]:
    """The ``leaves`` column as the list of leaf hashes."""
    return [leaves[j : j + HASH_BYTES] for j in range(0, len(leaves), HASH_BYTES)]
