"""Whole-batch gossip (spec §6.2, §7.3): a signed batch travels as one ``batch`` frame.
Pure.

The origin signs one Merkle root per group commit, and every message carries its audit
path so that it stays verifiable alone. On a ``hearthnet-peer.v3`` link
(:attr:`~hearthnet.mesh.protocol.PeerInfo.takes_batches`), a batch held whole goes as its
leaves (each message's signed JCS bytes) and the batch signature once: the receiver
rebuilds the tree from the leaves, checks the root's signature once (a root already
verified passes: :class:`~hearthnet.pubsub.batchsig.BatchVerifier`), and rebuilds each
message's proof, and each message holds the verified batch, so the log stores the batch
once (one row per commit, :mod:`hearthnet.pubsub.logstore`) as the origin made it.

Anything less than a whole batch (a peer missing part of one, a repair range that splits
one, a batch split between two commits, a message signed alone) goes as ``msg`` frames,
as does everything for a peer on an older link. A batch frame with one bad leaf, a
wrong ``n`` or a root that is not the one signed is refused whole: nothing of it is kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from hearthnet.canonical import MAX_EXACT_INTEGER, canonicalize
from hearthnet.errors import BadRequest, HearthNetError
from hearthnet.ids import is_node_id
from hearthnet.mesh.frames import BatchMsgs, Msg
from hearthnet.pubsub.batchsig import MAX_BATCH, VERIFIER, BatchVerifier, SignedBatch
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.merkle import MerkleTree, leaf_hash

# The leaves one batch frame carries, in bytes: a bigger batch goes as msg frames, so a
# frame stays well under the link's 2 MiB limit (protocol.MAX_FRAME_BYTES).
BATCH_FRAME_BYTES = 1024 * 1024


def _canonical(obj: dict[str, Any]) -> bytes:
    """The JCS bytes of a parsed leaf, as a verifier of one message would compute them."""
    seq, ts = obj.get("origin_seq"), obj.get("ts")
    if type(seq) is int and type(ts) is int and max(seq, ts) <= MAX_EXACT_INTEGER:
        return canonical_body(obj)
    return canonicalize(obj)


def parse_leaves(frame: BatchMsgs) -> list[dict[str, Any]]:
    """Each leaf of a batch frame as an object, checked to be message ``first + i`` of
    ``origin`` (enough to read the ids; :func:`prove_batch` checks the rest).

    Raises:
        BadRequest: a leaf that is not such a message; the batch is refused whole.
    """
    if not is_node_id(frame.origin) or frame.n > MAX_BATCH:
        raise BadRequest("batch.origin must be a NodeID and n at most the batch limit")
    objs: list[dict[str, Any]] = []
    for i, leaf in enumerate(frame.leaves):
        try:
            obj = orjson.loads(leaf)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"batch leaf {i} is not JSON") from exc
        if (
            not isinstance(obj, dict)
            or "sig" in obj
            or "data" not in obj
            or obj.get("origin") != frame.origin
            or obj.get("origin_seq") != frame.first + i
        ):
            raise BadRequest(f"batch leaf {i} is not message {frame.first + i} of the origin")
        objs.append(obj)
    return objs


def _check_canonical(objs: list[dict[str, Any]], leaves: tuple[bytes, ...]) -> None:
    """Each leaf is byte for byte the JCS form of its object (so the rebuilt message
    verifies alone anywhere); :class:`BadRequest` otherwise."""
    for i, (obj, leaf) in enumerate(zip(objs, leaves, strict=True)):
        try:
            canonical = _canonical(obj)
        except HearthNetError as exc:
            raise BadRequest(f"batch leaf {i}: {exc}") from exc
        if canonical != leaf:
            raise BadRequest(f"batch leaf {i} is not in canonical form")


def prove_batch(
    frame: BatchMsgs, objs: list[dict[str, Any]], verifier: BatchVerifier = VERIFIER
) -> list[Message]:
    """The messages of a batch frame whose leaves :func:`parse_leaves` gave ``objs``: the
    tree rebuilt, its root's signature checked once, each message given its proof.

    Raises:
        InvalidSignature: the root is not one the origin signed for these ``first``, ``n``.
        BadRequest / PayloadTooLarge: a leaf not in canonical form, or a message with a
            malformed field.
    """
    _check_canonical(objs, frame.leaves)
    hashes = [leaf_hash(leaf) for leaf in frame.leaves]
    tree = MerkleTree(hashes)
    verifier.verify_root(frame.origin, frame.first, frame.n, tree.root, frame.sig)
    batch = SignedBatch(frame.origin, frame.first, frame.sig, hashes, tree)
    messages = []
    for obj, leaf in zip(objs, frame.leaves, strict=True):
        sig, sig_json = batch.proof(obj["origin_seq"])
        raw = leaf[:-1] + b',"sig":' + sig_json + b"}"
        messages.append(Message.proved(obj, sig, raw, len(leaf), batch))
    verifier.count_batch(frame.n)
    return messages


def batch_of(message: Message) -> tuple[str, int, int] | None:
    """``(signature, first, n)`` of the batch ``message`` belongs to, or None when it is
    signed alone (read without making a batch member's proof)."""
    if message.batch is not None:
        return message.batch.signature, message.batch.first, message.batch.n
    sig = message.sig
    if isinstance(sig, dict):
        signature, first, n = sig.get("batch"), sig.get("first"), sig.get("n")
        if isinstance(signature, str) and type(first) is int and type(n) is int:
            return signature, first, n
    return None


def whole_batch(messages: Sequence[Message]) -> bool:
    """Whether ``messages`` are exactly one signed batch, in ``origin_seq`` order, small
    enough for one frame."""
    head = messages[0]
    batch = batch_of(head)
    if batch is None or batch[2] != len(messages) or len(messages) < 2:
        return False
    first = batch[1]
    size = 0
    for i, message in enumerate(messages):
        if (
            message.origin != head.origin
            or message.origin_seq != first + i
            or batch_of(message) != batch
        ):
            return False
        size += len(message.leaf())
    return size <= BATCH_FRAME_BYTES


def batch_runs(
    stored: Sequence[StoredMessage],
) -> Iterator[tuple[list[StoredMessage], bool]]:
    """A commit (or repair read) split into runs: each whole signed batch from one source
    (``True``), and every other message alone (``False``)."""
    i = 0
    while i < len(stored):
        message = stored[i].message
        batch = batch_of(message)
        if batch is not None and message.origin_seq == batch[1]:
            n = batch[2]
            run = list(stored[i : i + n]) if n >= 2 else []
            if (
                len(run) == n
                and all(s.source == stored[i].source for s in run)
                and whole_batch([s.message for s in run])
            ):
                yield run, True
                i += len(run)
                continue
        yield [stored[i]], False
        i += 1


def batch_frame(messages: Sequence[Message], hops: int) -> BatchMsgs:
    """The ``batch`` frame of a whole batch (see :func:`whole_batch`)."""
    head = messages[0]
    batch = batch_of(head)
    assert batch is not None
    return BatchMsgs(
        head.origin,
        head.origin_seq,
        len(messages),
        batch[0],
        tuple(m.leaf() for m in messages),
        hops,
    )


def repair_frames(rows: Sequence[bytes], batches: bool) -> list[bytes]:
    """The frames that answer an ``iwant`` with ``rows`` (raw envelopes from the log, one
    origin, ``origin_seq`` order): whole batches as ``batch`` frames when the peer takes
    them, the rest (or everything, when it does not) as ``msg`` frames."""
    if not batches:
        return [Msg(raw, 1).encode() for raw in rows]
    stored = [StoredMessage(0, Message.trusted(orjson.loads(raw), raw)) for raw in rows]
    out: list[bytes] = []
    for run, whole in batch_runs(stored):
        if whole:
            out.append(batch_frame([s.message for s in run], 1).encode())
        else:
            out.extend(Msg(s.message.raw, 1).encode() for s in run)
    return out
