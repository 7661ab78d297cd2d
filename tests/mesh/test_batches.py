"""Whole-batch gossip (spec §6.2): batch frames out of commits and repairs, verified once,
refused whole when anything in them is wrong, and msg frames for peers without the feature.
Pure, but for links that are never run (their queues are read directly)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from hearthnet.errors import BadRequest
from hearthnet.identity import KeyPair
from hearthnet.mesh.actions import Duplicate, Forward, ForwardBatch, Refused
from hearthnet.mesh.batches import batch_frame, repair_frames
from hearthnet.mesh.frames import BatchMsgs, Msg, parse_frame
from hearthnet.mesh.gossip import Gossip
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.pathseq import is_gossip
from hearthnet.mesh.protocol import PeerInfo, decode_frame
from hearthnet.mesh.routing import Routes
from hearthnet.pubsub.batchsig import VERIFIER, sign_batch
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from tests.mesh.test_links import ResetSocket


def batch_of(seed: int, n: int, first: int = 1, binary: int | None = None) -> list[Message]:
    """``n`` messages signed as one batch by a key of its own (so no root is cached);
    message ``binary`` (an index) with a bytes payload (``data_enc``)."""
    keys = KeyPair.from_seed(bytes([seed]) * 32)
    bodies = [
        Message.unsigned(
            keys.node_id,
            topic="g.b",
            msg_type="m",
            data=bytes([i]) if i == binary else {"i": i},
            origin_seq=first + i,
            ts=5,
        )
        for i in range(n)
    ]
    return Message.signed_batch(keys, bodies, [canonical_body(b) for b in bodies])


def wire(frame: BatchMsgs) -> BatchMsgs:
    """The frame as a peer receives it: encoded, decoded and parsed."""
    parsed = parse_frame(decode_frame(frame.encode()))
    assert isinstance(parsed, BatchMsgs)
    return parsed


def test_a_committed_batch_travels_as_one_frame_and_arrives_as_the_origin_signed_it() -> None:
    """A whole batch in a commit becomes one batch frame; the receiver delivers all of it,
    byte for byte as the origin's messages (proofs rebuilt), for one signature check."""
    batch = batch_of(0x31, 7)
    sender = Gossip(lambda _id: False, 100)
    forwards = sender.committed([StoredMessage(i + 1, m) for i, m in enumerate(batch)], True)
    assert isinstance(forwards[0], ForwardBatch)
    receiver = Gossip(lambda _id: False, 100)
    before = VERIFIER.signatures_checked
    got = receiver.receive_batch(wire(forwards[0].batch), "peer-a")
    assert (1, [m.raw for m in batch], [1] * 7, 1) == (
        len(forwards),
        [d.message.raw for d in got] if isinstance(got, list) else got,
        [d.hops for d in got] if isinstance(got, list) else got,
        VERIFIER.signatures_checked - before,
    )


def test_a_batch_held_already_is_a_duplicate_and_a_partly_held_one_delivers_the_rest() -> None:
    """A second copy of a batch frame is a duplicate; with two of its messages held, the
    other three are delivered."""
    batch = batch_of(0x32, 5)
    frame = wire(batch_frame(batch, 2))
    first = Gossip(lambda _id: False, 100)
    delivered = first.receive_batch(frame, "peer-a")
    again = first.receive_batch(frame, "peer-b")
    held = {batch[0].id, batch[3].id}
    partly = Gossip(held.__contains__, 100).receive_batch(frame, "peer-a")
    assert (5, Duplicate(), [batch[1], batch[2], batch[4]]) == (
        len(delivered) if isinstance(delivered, list) else delivered,
        again,
        [d.message for d in partly] if isinstance(partly, list) else partly,
    )


def refusal(gossip: Gossip, frame: BatchMsgs) -> str | None:
    """The label a batch frame was refused under (None: not refused)."""
    outcome = gossip.receive_batch(frame, "peer-x")
    return outcome.label if isinstance(outcome, Refused) else None


def test_a_bad_batch_is_refused_whole_and_leaves_no_trace() -> None:
    """One altered message, a shifted first, a subset under the batch's signature, or
    another batch's signature: each refuses the batch whole; the true batch is then
    delivered in full."""
    batch = batch_of(0x33, 6)
    good = batch_frame(batch, 1)
    altered = orjson.loads(good.leaves[2])
    altered["data"] = {"i": 99}
    leaves = list(good.leaves)
    leaves[2] = canonical_body(altered)
    other = batch_frame(batch_of(0x34, 6), 1)
    gossip = Gossip(lambda _id: False, 100)
    labels = [
        refusal(gossip, dataclasses.replace(good, leaves=tuple(leaves))),
        refusal(gossip, dataclasses.replace(good, first=2)),
        refusal(gossip, dataclasses.replace(good, n=5, leaves=good.leaves[:5])),
        refusal(gossip, dataclasses.replace(good, sig=other.sig)),
    ]
    after = gossip.receive_batch(good, "peer-a")
    assert (["gossip_batch"] * 4, 6) == (labels, len(after) if isinstance(after, list) else 0)


def test_a_signed_batch_of_leaves_not_in_canonical_form_is_refused() -> None:
    """Leaves the origin signed but that are not their own JCS form are refused: the
    messages rebuilt from them would not verify alone anywhere else."""
    keys = KeyPair.from_seed(b"\x3c" * 32)
    bodies = [
        Message.unsigned(keys.node_id, topic="g.b", msg_type="m", data=i, origin_seq=i + 1, ts=5)
        for i in range(3)
    ]
    leaves = [canonical_body(b) for b in bodies]
    leaves[1] = leaves[1].replace(b'"data":', b'"data": ')
    sigs, _ = sign_batch(keys, 1, leaves)
    frame = BatchMsgs(keys.node_id, 1, 3, sigs[0]["batch"], tuple(leaves))
    assert "gossip_batch" == refusal(Gossip(lambda _id: False, 100), frame)


def test_a_batch_frame_whose_n_is_not_its_leaf_count_is_malformed() -> None:
    """n must count the leaves: a frame that says 6 and carries 5 is bad_request."""
    good = batch_frame(batch_of(0x35, 6), 1)
    obj = decode_frame(dataclasses.replace(good, leaves=good.leaves[:5]).encode())
    with pytest.raises(BadRequest):
        parse_frame(obj)


def test_partial_batches_and_single_signatures_go_as_msg_frames() -> None:
    """A commit holding part of a batch, or a message signed alone, forwards msg frames."""
    batch = batch_of(0x36, 4)
    single = Message.create(
        KeyPair.from_seed(b"\x37" * 32), topic="g.s", msg_type="m", data=1, origin_seq=1, ts=5
    )
    stored = [StoredMessage(i + 1, m) for i, m in enumerate([*batch[1:], single])]
    forwards = Gossip(lambda _id: False, 100).committed(stored, True)
    assert [Forward(Msg(m.raw, 1).encode(), None) for m in [*batch[1:], single]] == forwards


def link_to(node: str, link: int) -> PeerLink:
    """A link to ``node`` of peer-link version ``link``; up and never run."""
    return PeerLink(
        PeerInfo(node, "", None, "0.3.0", link=link),
        ResetSocket(),
        outbound=True,
        on_frame=lambda link, frame: None,
        on_down=lambda link, reason: None,
    )


def queued_kinds(link: PeerLink) -> list[str]:
    """The kinds of the frames queued on ``link``."""
    return [str(decode_frame(data)["t"]) for data in link._queue]


async def test_a_batch_goes_whole_on_v3_links_and_as_msgs_on_older_ones() -> None:
    """Forwarding a batch of 3 whose second message has a bytes payload: a peer on a v3
    link gets one batch frame, a v2 peer the two other messages as msg frames, the source
    nothing; a lone data_enc message goes to the v3 peer only."""
    routes = Routes("ed25519:a")
    new, old, source = (
        link_to("ed25519:b", 3),
        link_to("ed25519:c", 2),
        link_to("ed25519:d", 3),
    )
    for link in (new, old, source):
        routes.admit(link)
    batch = batch_of(0x38, 3, binary=1)
    routes.forward_batch(ForwardBatch(batch_frame(batch, 1), tuple(batch), (1, 1, 1), "ed25519:d"))
    old_msgs = [decode_frame(data)["raw"] for data in old._queue]
    routes.forward(Forward(Msg(batch[1].raw, 1).encode(), "ed25519:d", binary=True))
    assert (["batch", "msg"], [batch[0].raw, batch[2].raw], []) == (
        queued_kinds(new),
        old_msgs,
        queued_kinds(source),
    )


def test_a_repair_sends_whole_batches_as_batch_frames_and_the_rest_as_msgs() -> None:
    """Rows 2..9 of two batches of 5 (1..5, 6..10): 2..5 is part of the first, so msg
    frames; 6..9 too; a range 1..10 is two batch frames; an older peer gets msgs."""
    rows = [m.raw for m in batch_of(0x39, 5) + batch_of(0x39, 5, first=6)]
    kinds = [
        [str(decode_frame(f)["t"]) for f in repair_frames(rows[1:9], batches=True)],
        [str(decode_frame(f)["t"]) for f in repair_frames(rows, batches=True)],
        [str(decode_frame(f)["t"]) for f in repair_frames(rows, batches=False)],
    ]
    assert [["msg"] * 8, ["batch"] * 2, ["msg"] * 10] == kinds


def test_a_batch_frame_is_gossip_a_paced_relay_path_may_shed() -> None:
    """Like msg, a batch frame is gossip (anti-entropy brings it again if shed)."""
    batch = batch_of(0x3D, 2)
    assert (True, True) == (
        is_gossip(batch_frame(batch, 1).encode()),
        is_gossip(Msg(b"{}").encode()),
    )
