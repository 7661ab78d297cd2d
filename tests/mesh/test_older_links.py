"""A peer on a link older than v3: messages with data_enc are withheld from it, and its
anti-entropy is moved past them instead of asking again every round. Pure."""

from __future__ import annotations

import orjson

from hearthnet.mesh.frames import IHave, IWant
from hearthnet.mesh.gossip import IWANT_RETRY_S, Gossip
from hearthnet.mesh.older_links import Withheld, older_repair
from hearthnet.mesh.protocol import decode_frame
from hearthnet.pubsub.envelope import Message

ORIGIN = "ed25519:origin"


def raw(seq: int, binary: bool) -> bytes:
    """Message ``seq`` of the origin as the log reads it (unsigned: only its fields count)."""
    data = b"\x01" if binary else {"i": seq}
    body = Message.unsigned(ORIGIN, topic="t", msg_type="m", data=data, origin_seq=seq, ts=1)
    return orjson.dumps(body)


def test_the_repair_for_an_older_peer_leaves_out_data_enc_and_counts_the_leading_run() -> None:
    """Rows 3..7 with 3, 4 and 6 binary, asked from 3: msg frames for 5 and 7, and a
    leading run of 2 (6 is not in it)."""
    rows = [raw(s, s in (3, 4, 6)) for s in range(3, 8)]
    frames, leading = older_repair(rows, 3)
    assert ([rows[2], rows[4]], 2) == ([decode_frame(f)["raw"] for f in frames], leading)


def core() -> Gossip:
    """A gossip core that knows no message ids."""
    return Gossip(lambda _id: False, 100)


def held(gossip: Gossip, *seqs: int) -> None:
    """``gossip``'s node holds these ``origin_seq``s of the origin."""
    for seq in seqs:
        gossip.tracker.add(ORIGIN, seq)


def test_an_older_peer_skips_a_withheld_run_after_one_iwant() -> None:
    """We hold 1..5, 3 binary; the older peer holds 1, 2, 4, 5: it asks for 3 once, the
    answer's ihave moves its head to 5, and the next round it asks nothing."""
    ours, peer, withheld = core(), core(), Withheld()
    held(ours, 1, 2, 3, 4, 5)
    held(peer, 1, 2, 4, 5)
    first = peer.receive_ihave(withheld.ihave("p", ours.ihave()), now=0.0)
    _, leading = older_repair([raw(3, True)], 3)
    skip = withheld.repaired("p", ORIGIN, 3, leading, ours.tracker.heads[ORIGIN])
    assert skip is not None
    peer.receive_ihave(skip, now=0.0)
    later = peer.receive_ihave(withheld.ihave("p", ours.ihave()), now=2 * IWANT_RETRY_S)
    assert (IWant({ORIGIN: (3, 3)}), 5, None) == (first, peer.tracker.heads[ORIGIN], later)


def test_a_withheld_run_at_our_head_is_hidden_until_a_plain_message_follows() -> None:
    """We hold 1..3, 3 binary; the older peer holds 1, 2: after one iwant it is shown head
    2 (no more iwants); message 4 without data_enc shows it 4 again, and it skips 3."""
    ours, peer, withheld = core(), core(), Withheld()
    held(ours, 1, 2, 3)
    held(peer, 1, 2)
    asked = [peer.receive_ihave(withheld.ihave("p", ours.ihave()), now=0.0)]
    _, leading = older_repair([raw(3, True)], 3)
    assert withheld.repaired("p", ORIGIN, 3, leading, ours.tracker.heads[ORIGIN]) is None
    asked.append(peer.receive_ihave(withheld.ihave("p", ours.ihave()), now=2 * IWANT_RETRY_S))
    held(ours, 4)
    held(peer, 4)  # forwarded live
    withheld.committed([(ORIGIN, 4, False)])
    asked.append(peer.receive_ihave(withheld.ihave("p", ours.ihave()), now=4 * IWANT_RETRY_S))
    _, leading = older_repair([raw(3, True)], 3)
    skip = withheld.repaired("p", ORIGIN, 3, leading, ours.tracker.heads[ORIGIN])
    assert skip is not None
    peer.receive_ihave(skip, now=4 * IWANT_RETRY_S)
    assert ([IWant({ORIGIN: (3, 3)}), None, IWant({ORIGIN: (3, 3)})], 4) == (
        asked,
        peer.tracker.heads[ORIGIN],
    )


def test_an_older_peer_is_asked_again_at_an_unmoved_head_only_after_a_doubling_wait() -> None:
    """An older peer whose head is past a hole it cannot fill is asked for it at 0, 12 and
    36 s (waits of 10 s, then 20 s) of rounds every 6 s; a v3 peer with the same head at
    every round (its retry time, 5 s, is up)."""
    asked = []
    for older in ("p", None):
        gossip = core()
        held(gossip, 1, 2, 4)
        ihave = IHave({ORIGIN: 4}, {ORIGIN: 1})
        rounds = [gossip.receive_ihave(ihave, now=6.0 * i, older=older) for i in range(7)]
        asked.append([i for i, iwant in enumerate(rounds) if iwant == IWant({ORIGIN: (3, 3)})])
    assert [[0, 2, 6], [0, 1, 2, 3, 4, 5, 6]] == asked
