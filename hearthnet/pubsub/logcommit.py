"""The log's commit job and retention deletes, run in the writer thread (spec §6.2-§6.4).

One job per batch: sign the local publishes (one batch signature per run of consecutive
``origin_seq``), drop peers' duplicates and number the rest (the
:class:`~hearthnet.pubsub.sequencer.Sequencer`, read only here), insert one row per signed
batch and one per run of whole envelopes (see :mod:`hearthnet.pubsub.logstore`) and the
changed durable consumers, commit. No message's proof is made on the way in.

A batch is a list of :class:`Pending` entries: a peer's message, a lone local publish, or
a run of local publishes queued together (:meth:`MessageLog.publish_many
<hearthnet.pubsub.log.MessageLog.publish_many>`: one entry and one :class:`Group` for
all of them, not one per message). The job returns one outcome per message, in queue
order.

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
from typing import Any, cast

from hearthnet.errors import (
    HearthNetError,
    InternalError,
    StorageError,
    Unavailable,
    WireError,
)
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulids
from hearthnet.pubsub.batchsig import SignedBatch
from hearthnet.pubsub.consumerstate import ConsumerRecord, ConsumerState, write_consumers
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.floorruns import Removed
from hearthnet.pubsub.logfloors import by_origin, removal, save_removed
from hearthnet.pubsub.logindex import Head, LogIndex
from hearthnet.pubsub.logrun import store_row, write_run
from hearthnet.pubsub.logstore import (
    INSERT_ROW,
    HeadColumns,
    Row,
    pack_heads,
    split_bodies,
    transaction,
    unpack_heads,
)
from hearthnet.pubsub.merkle import hash_leaves
from hearthnet.pubsub.sequencer import Sequencer

log = logging.getLogger("hearthnet.pubsub.log")

# What became of one pending message in a commit: stored, a duplicate (None), or refused.
Outcome = StoredMessage | HearthNetError | None
# Told the outcomes of a group of publishes, in order, in the loop turn of the commit
# that decided the last of them (no future, no callback turn).
Answer = Callable[[list[Outcome]], None]


class Group:
    """Local publishes queued together: one future, or one :data:`Answer`, for all of
    them, given every outcome in order once each is committed or refused. A group is
    one :class:`Pending` entry, split only to cap a commit at ``max_batch`` messages or
    to retry its messages one by one."""

    __slots__ = ("answer", "future", "left", "outcomes", "size")

    def __init__(
        self,
        size: int,
        future: asyncio.Future[list[Outcome]] | None = None,
        answer: Answer | None = None,
    ) -> None:
        self.size = size
        self.left = size
        self.outcomes: list[Outcome] | None = None  # made when a part is settled alone
        self.future = future
        self.answer = answer

    def settle(self, start: int, outcomes: list[Outcome]) -> None:
        """The outcomes of the group's publishes from place ``start`` on (once each);
        the last part tells the future or the answer."""
        n = len(outcomes)
        if n == self.size:
            done = outcomes  # the whole group in one commit: the usual case
        else:
            held = self.outcomes
            if held is None:
                held = self.outcomes = [None] * self.size
            held[start : start + n] = outcomes
            self.left -= n
            if self.left > 0:
                return
            done = held
        self.left = 0
        answer = self.answer
        if answer is not None:
            self.answer = None
            try:
                answer(done)
            except Exception:  # the commit stands; the other publishers are answered
                log.exception("the answer to a group of publishes failed")
            return
        future = self.future
        if future is not None and not future.done():
            future.set_result(done)


@dataclass(slots=True)
class Pending:
    """Messages waiting for their commit: a peer's message, one local publish, or a run
    of a group's (their ``origin_seq`` consecutive, in queue order)."""

    future: asyncio.Future[StoredMessage | None] | None  # a lone publish, a peer's message
    message: Message | None = None  # a peer's message (verified)
    source: str | None = None  # the peer it came from
    bodies: list[dict[str, Any]] | None = None  # our publishes' fields before signing
    group: Group | None = None  # the group ``bodies`` belong to
    start: int = 0  # the place of ``bodies[0]`` in ``group``
    ts: int | None = None  # every body's ts, none with ttl_s (see logrun.write_run)

    @property
    def size(self) -> int:
        """How many messages this entry holds."""
        bodies = self.bodies
        return 1 if bodies is None else len(bodies)

    def answer(self, outcomes: list[Outcome]) -> None:
        """Settle this entry with its messages' ``outcomes`` (once): its group's places,
        or its future (an error fails it)."""
        group = self.group
        if group is not None:
            group.settle(self.start, outcomes)
            return
        future = self.future
        if future is None or future.done():
            return
        outcome = outcomes[0]
        if isinstance(outcome, HearthNetError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def split(self, at: int) -> tuple[Pending, Pending]:
        """This run of a group's publishes as two entries: its first ``at`` and the rest."""
        bodies = self.bodies
        assert bodies is not None
        assert self.group is not None
        return (
            Pending(None, bodies=bodies[:at], group=self.group, start=self.start, ts=self.ts),
            Pending(None, bodies=bodies[at:], group=self.group, start=self.start + at, ts=self.ts),
        )

    def singles(self) -> list[Pending]:
        """Each message of this entry as an entry of its own (to commit one by one)."""
        bodies = self.bodies
        if bodies is None or len(bodies) == 1:
            return [self]
        group = self.group
        assert group is not None
        return [
            Pending(None, bodies=[body], group=group, start=self.start + i)
            for i, body in enumerate(bodies)
        ]


def answer_all(batch: list[Pending], outcomes: list[Outcome]) -> None:
    """Settle each entry of ``batch`` with its part of ``outcomes`` (one per message, in
    queue order)."""
    if len(batch) == 1:
        batch[0].answer(outcomes)
        return
    at = 0
    for pending in batch:
        group = pending.group
        if group is None:  # one message (a lone publish, a peer's): no list of one
            future = pending.future
            if future is not None and not future.done():
                outcome = outcomes[at]
                if isinstance(outcome, HearthNetError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
            at += 1
            continue
        assert pending.bodies is not None
        n = len(pending.bodies)
        group.settle(pending.start, outcomes[at : at + n])
        at += n


def refuse(batch: list[Pending], exc: Exception) -> None:
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
        pending.answer([error] * pending.size)


def take_batch(
    pending: list[Pending], queued: int, limit: int
) -> tuple[list[Pending], list[Pending]]:
    """The next batch of a queue holding ``queued`` messages: its first entries, up to
    ``limit`` messages (a group's run split at the bound), and what is left queued."""
    if queued <= limit:
        return pending, []
    count = 0
    for i, entry in enumerate(pending):
        size = entry.size
        if count + size < limit:
            count += size
            continue
        if count + size == limit:
            return pending[: i + 1], pending[i + 1 :]
        head, tail = entry.split(limit - count)  # only a group's run holds more than one
        return [*pending[:i], head], [tail, *pending[i + 1 :]]
    return pending, []  # not reached: ``queued`` says there is more


# A local publish signed in a batch: its canonical bytes without ``sig`` and the batch.
Signed = tuple[bytes, SignedBatch]


def sign_local(
    keys: KeyPair, bodies: list[dict[str, Any]]
) -> list[Signed | Message | HearthNetError]:
    """Sign our publishes of a batch (in the writer thread), in queue order: one batch
    signature per run of consecutive ``origin_seq`` (spec §6.2); a publish refused here
    (data the edge let through but JCS cannot sign) leaves its number unused and splits
    the run. Returns per publish its canonical bytes and batch (no :class:`Message` is
    made: see :meth:`StoredMessage.of_batch`), its :class:`Message` when it was signed
    alone (a run of one), or its error. Gives the bodies without an id theirs first."""
    fresh = [body for body in bodies if not body["id"]]
    if fresh:  # queued without an id: given here, at once, in origin_seq order
        for body, message_id in zip(fresh, new_ulids([f["ts"] for f in fresh]), strict=True):
            body["id"] = message_id
    n = len(bodies)
    if n > 1 and bodies[-1]["origin_seq"] - bodies[0]["origin_seq"] == n - 1:
        # The usual batch: one run (origin_seq is numbered in queue order, so consecutive
        # first to last means consecutive throughout).
        try:
            leaves = [canonical_body(body) for body in bodies]
        except HearthNetError:
            pass  # one of them cannot be signed: the run is cut around it below
        else:
            batch = SignedBatch.sign(keys, bodies[0]["origin_seq"], hash_leaves(leaves))
            return [(leaf, batch) for leaf in leaves]
    out: list[Signed | Message | HearthNetError] = []
    run: list[bytes] = []  # the canonical bytes of the run being gathered
    run_bodies: list[dict[str, Any]] = []
    next_seq = 0

    def close_run() -> None:
        if len(run) == 1:
            out.append(Message.signed_batch(keys, [{**run_bodies[0]}], run)[0])
        elif run:
            batch = SignedBatch.sign(keys, run_bodies[0]["origin_seq"], hash_leaves(run))
            out.extend([(leaf, batch) for leaf in run])
        run.clear()
        run_bodies.clear()

    for body in bodies:
        try:
            leaf = canonical_body(body)
        except HearthNetError as exc:
            close_run()
            out.append(exc)
            continue
        origin_seq = body["origin_seq"]
        if run and origin_seq != next_seq:
            close_run()
        next_seq = origin_seq + 1
        run.append(leaf)
        run_bodies.append(body)
    close_run()
    return out


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


def _rows_of_ours(seq: int, bodies: list[dict[str, Any]], signed: list[Signed]) -> list[Row]:
    """The rows of a commit of our publishes only, each signed in a batch, numbered from
    ``seq``: a row per batch, its headers made as columns from the fields (no
    :class:`Head` per message)."""
    rows: list[Row] = []
    i, n = 0, len(bodies)
    while i < n:
        batch = signed[i][1]
        j = min(n, i + batch.n)
        while signed[j - 1][1] is not batch:  # a batch cut short (not usual): its own part
            j -= 1
        run, leaves = bodies[i:j] if i or j < n else bodies, [s[0] for s in signed[i:j]]
        ts = [body["ts"] for body in run]
        ttls = [body.get("ttl_s") for body in run]
        row = _row_for(seq + i, batch)
        row.cols = HeadColumns(
            range(seq + i, seq + j),
            [body["id"] for body in run],
            [body["topic"] for body in run],
            [batch.origin] * (j - i),
            [body["origin_seq"] for body in run],
            ts,
            ttls
            if ttls.count(None) == len(ttls)
            else [
                t + ttl * 1000 if ttl is not None else None for t, ttl in zip(ts, ttls, strict=True)
            ],
            [len(leaf) for leaf in leaves],
        )
        row.bodies = leaves
        rows.append(row)
        i = j
    return rows


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
    consumers, commit. Returns, per message in queue order, what was stored (None: a
    duplicate; an error: this publish failed alone), and the rows written."""
    if len(batch) == 1 and batch[0].bodies is not None:
        bodies = batch[0].bodies  # one group's run, or one publish: the usual batch
        peers = False
        if run := write_run(conn, keys, bodies, batch[0].ts, sequencer.head_seq + 1, consumers):
            return cast("list[Outcome]", run[0]), [run[1]]
    else:
        bodies, peers = [], False
        for pending in batch:
            if pending.bodies is None:
                peers = True
            else:
                bodies += pending.bodies
    signed = sign_local(keys, bodies) if bodies else []
    head = sequencer.head_seq
    if not peers and len(signed) == 1 and type(signed[0]) is Message:
        # A lone publish (one in flight), signed alone: new by construction, so at
        # head + 1, its row and headers made here (no numbering pass, no row search).
        return _write_lone(conn, head + 1, signed[0], consumers)
    if not peers and all(type(s) is tuple for s in signed):
        # Only our publishes, each signed in a batch: new by construction, so numbered
        # head + 1 on, and committed as their fields (see StoredMessage.of_batch).
        of_batch = StoredMessage.of_batch
        stored = [
            of_batch(seq, body, leaf, signature)
            for seq, body, (leaf, signature) in zip(
                range(head + 1, head + 1 + len(bodies)),
                bodies,
                cast("list[Signed]", signed),
                strict=True,
            )
        ]
        results: list[Outcome] = list(stored)
        rows = _rows_of_ours(head + 1, bodies, cast("list[Signed]", signed))
    else:
        results, stored = _number(batch, signed, sequencer)
        rows = rows_of(stored)

    def work() -> None:
        conn.executemany(INSERT_ROW, [row.params() for row in rows])
        write_consumers(conn, consumers)

    transaction(conn, work)
    return results, rows


def _write_lone(
    conn: sqlite3.Connection,
    seq: int,
    message: Message,
    consumers: list[tuple[ConsumerRecord, ConsumerState]],
) -> tuple[list[Outcome], list[Row]]:
    """Commit our lone publish, signed alone, at ``seq``: a row of one whole envelope
    (what :func:`rows_of` makes of it), its headers as columns of one. Without changed
    consumers the INSERT is the transaction (the connection is in autocommit mode):
    durable on its own, two statements fewer than ``BEGIN`` .. ``COMMIT``."""
    raw = message.raw
    row = Row(seq, "", 0, 0, [], [raw])
    row.cols = HeadColumns(
        (seq,),
        (message.id,),
        (message.topic,),
        (message.origin,),
        (message.origin_seq,),
        (message.ts,),
        (message.expires_ms,),
        (len(raw),),
    )
    store_row(conn, row.params(), consumers)
    return [StoredMessage(seq, message)], [row]


def _number(
    batch: list[Pending], signed: list[Signed | Message | HearthNetError], sequencer: Sequencer
) -> tuple[list[Outcome], list[StoredMessage]]:
    """A batch with peers' messages, publishes signed alone or refused: each message
    numbered by the sequencer (a peer's message the log holds, or that came earlier in
    the batch, takes no number). Returns the outcomes and what is to be stored."""
    entries: list[tuple[Pending, dict[str, Any] | None, Signed | Message | HearthNetError | None]]
    entries = []
    done = iter(signed)
    for pending in batch:
        if pending.bodies is None:
            entries.append((pending, None, None))
        else:
            entries += [(pending, body, next(done)) for body in pending.bodies]
    items: list[tuple[str, bool] | None] = []
    for pending, body, sig in entries:
        if body is None:
            assert pending.message is not None
            items.append((pending.message.id, False))
        elif isinstance(sig, HearthNetError):
            items.append(None)
        else:
            items.append((body["id"], True))
    results: list[Outcome] = []
    stored: list[StoredMessage] = []
    for (pending, body, sig), seq in zip(entries, sequencer.number(items), strict=True):
        if isinstance(sig, HearthNetError):
            results.append(sig)
            continue
        if seq is None:
            results.append(None)  # a peer's message the log holds
            continue
        if isinstance(sig, tuple):
            assert body is not None
            item = StoredMessage.of_batch(seq, body, sig[0], sig[1])
        elif isinstance(sig, Message):
            item = StoredMessage(seq, sig)
        else:
            assert pending.message is not None
            item = StoredMessage(seq, pending.message, pending.source)
        results.append(item)
        stored.append(item)
    return results, stored


def delete_rows(
    conn: sqlite3.Connection,
    *,
    index: LogIndex,
    doomed: dict[int, set[int]],
    origin_seq: int,
    head_seq: int,
) -> tuple[list[Head], list[int], dict[str, Removed]]:
    """Delete messages (retention) in one transaction: ``doomed`` maps a row's key to the
    seqs to delete from it. A row left empty is deleted; a row that keeps some messages
    is rewritten with their headers and bodies (its batch's signature and leaves
    unchanged). Returns the deleted headers, the keys of the rows deleted, and the
    records of what retention removed that changed (:func:`~.logfloors.removal`)."""

    def work() -> tuple[list[Head], list[int], dict[str, Removed]]:
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
        records = removal(index, by_origin((h.origin, h.origin_seq) for h in gone))
        save_removed(conn, records)
        return gone, emptied, records

    return transaction(conn, work)
