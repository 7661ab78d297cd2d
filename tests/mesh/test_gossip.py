"""Gossip bookkeeping: held origin_seqs and anti-entropy planning (spec §7.3). Pure."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.mesh.actions import Deliver, Duplicate, Forward, Refused, Repair
from hearthnet.mesh.frames import IHave, IWant, Msg
from hearthnet.mesh.gossip import IWANT_SLICE, AntiEntropy, Gossip, OriginTracker
from hearthnet.pubsub.batchsig import VERIFIER
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.floorruns import Removed, after_removal
from hearthnet.pubsub.logindex import origin_start


def test_out_of_order_seqs_fold_into_the_head() -> None:
    """1, 2, 4, 5 then 3: the head moves to 5 once the hole is filled."""
    tracker = OriginTracker()
    for seq in (1, 2, 4, 5):
        tracker.add("o", seq)
    before = tracker.heads["o"]
    tracker.add("o", 3)
    assert (2, 5, {}) == (before, tracker.heads["o"], tracker.above)


def test_missing_slices_stop_before_what_is_held() -> None:
    """Behind a peer at 900 with 10..12 held above a hole, ask 4..9 first, in bounded slices."""
    tracker = OriginTracker()
    for seq in (1, 2, 3, 10, 11, 12):
        tracker.add("o", seq)
    fresh = OriginTracker()
    assert ((4, 9), (1, IWANT_SLICE), None) == (
        tracker.missing("o", 900),
        fresh.missing("o", 900),
        tracker.missing("o", 3),
    )


def test_skip_a_hole_nobody_holds() -> None:
    """When an ahead peer's lowest held seq is 500, stop asking for 4..499 (500 is next)."""
    tracker = OriginTracker()
    for seq in (1, 2, 3, 501):
        tracker.add("o", seq)
    tracker.skip_to("o", 500)
    skipped = (tracker.heads["o"], tracker.missing("o", 700))
    tracker.add("o", 500)
    assert ((499, (500, 500)), 501) == (skipped, tracker.heads["o"])


def test_one_request_per_origin_at_a_time() -> None:
    """Two peers ahead: ask the first; ask again only after the retry time or an answer."""
    anti = AntiEntropy(OriginTracker())
    first = anti.plan({"o": 10}, now=0.0)
    second = anti.plan({"o": 10}, now=1.0)
    later = anti.plan({"o": 10}, now=6.0)
    anti.answered("o")
    again = anti.plan({"o": 10}, now=6.1)
    assert ({"o": [1, 10]}, {}, {"o": [1, 10]}, {"o": [1, 10]}) == (first, second, later, again)


@given(st.permutations(list(range(1, 60))))
def test_any_arrival_order_ends_with_the_full_head(order: list[int]) -> None:
    """Whatever order 1..59 arrive in, the head ends at 59 with nothing left above."""
    tracker = OriginTracker()
    for seq in order:
        tracker.add("o", seq)
    assert (59, {}, 0) == (tracker.heads["o"], tracker.above, tracker.above_count)


ORIGIN = KeyPair.from_seed(b"\x11" * 32)


def signed(seq: int) -> Message:
    """A message of ORIGIN numbered ``seq``."""
    return Message.create(ORIGIN, topic="chat.a", msg_type="m", data=seq, origin_seq=seq, ts=5)


def test_a_new_message_is_delivered_once_and_a_second_copy_is_a_duplicate() -> None:
    """The first copy of a message is delivered with its hops; a copy that arrives while
    it is being ingested is a duplicate; a malformed one is refused."""
    gossip = Gossip(lambda _id: False, 100)
    message = signed(1)
    first = gossip.receive_msg(Msg(message.raw, 3), "peer-a")
    second = gossip.receive_msg(Msg(message.raw, 1), "peer-b")
    broken = gossip.receive_msg(Msg(b"{not json", 1), "peer-c")
    assert (Deliver(message, "peer-a", 3), Duplicate(), "peer-c") == (
        first,
        second,
        broken.source if isinstance(broken, Refused) else None,
    )


def test_a_message_from_a_non_member_origin_is_refused_and_a_later_copy_is_delivered() -> None:
    """A validly signed message whose origin is not a member is refused (labelled
    gossip_origin) and leaves no trace: once the origin is a member, a copy is delivered."""
    members: set[str] = set()
    gossip = Gossip(lambda _id: False, 100, is_member=members.__contains__)
    message = signed(1)
    before = gossip.receive_msg(Msg(message.raw, 1), "peer-a")
    members.add(ORIGIN.node_id)
    after = gossip.receive_msg(Msg(message.raw, 1), "peer-a")
    assert ("gossip_origin", Deliver(message, "peer-a", 1)) == (
        before.label if isinstance(before, Refused) else None,
        after,
    )


def test_a_commit_is_forwarded_once_encoded_past_its_source_with_one_more_hop() -> None:
    """A committed message goes to every link but its source, hops + 1, and is tracked."""
    gossip = Gossip(lambda _id: False, 100)
    message = signed(1)
    gossip.receive_msg(Msg(message.raw, 2), "peer-a")
    forwards = gossip.committed([StoredMessage(1, message, "peer-a")], linked=True)
    assert ([Forward(Msg(message.raw, 3).encode(), "peer-a")], 1) == (
        forwards,
        gossip.tracker.heads[ORIGIN.node_id],
    )


def test_an_ihave_ahead_of_us_is_answered_with_an_iwant_once() -> None:
    """Behind a peer's head, ask for the range; a second peer's ihave does not ask again."""
    gossip = Gossip(lambda _id: False, 100)
    first = gossip.receive_ihave(IHave({"o": 10}, {"o": 1}), now=0.0)
    second = gossip.receive_ihave(IHave({"o": 10}, {"o": 1}), now=1.0)
    assert (IWant({"o": (1, 10)}), None) == (first, second)


def test_one_repair_per_peer_runs_at_a_time() -> None:
    """An iwant while the peer's repair runs is ignored; after it ends, the next is run."""
    gossip = Gossip(lambda _id: False, 100)
    want = IWant({"o": (1, 5)})
    first = gossip.receive_iwant(want, "peer-a")
    during = gossip.receive_iwant(want, "peer-a")
    gossip.repaired("peer-a")
    after = gossip.receive_iwant(want, "peer-a")
    expected = Repair("peer-a", (("o", 1, 5),), 100)
    assert (expected, None, expected) == (first, during, after)


def test_a_gossiped_batch_costs_one_signature_check_and_a_forgery_is_refused() -> None:
    """Batch-signed messages from a peer are all delivered with one ed25519 check for the
    batch; a copy with changed data is refused."""
    keys = KeyPair.from_seed(b"\x77" * 32)
    bodies = [
        Message.unsigned(keys.node_id, topic="g.b", msg_type="m", data=i, origin_seq=i + 1, ts=5)
        for i in range(9)
    ]
    batch = Message.signed_batch(keys, bodies, [canonical_body(b) for b in bodies])
    gossip = Gossip(lambda _id: False, 100)
    before = VERIFIER.signatures_checked
    actions = [gossip.receive_msg(Msg(m.raw, 1), "peer") for m in batch]
    forged = orjson.dumps({**orjson.loads(batch[3].raw), "id": new_ulid(), "data": 99})
    refused = gossip.receive_msg(Msg(forged, 1), "peer")
    assert ([True] * 9, 1, True) == (
        [isinstance(a, Deliver) and a.message == m for a, m in zip(actions, batch, strict=True)],
        VERIFIER.signatures_checked - before,
        isinstance(refused, Refused),
    )


def test_a_message_a_peer_advertised_before_it_came_is_catch_up() -> None:
    """Messages at or below a head a peer advertised in an ihave arrive as catch-up
    (backlog); a message published after that arrives live."""
    gossip = Gossip(lambda _id: False, 100)
    gossip.receive_ihave(IHave({ORIGIN.node_id: 2}, {ORIGIN.node_id: 1}), now=0.0)
    got = [gossip.receive_msg(Msg(signed(seq).raw, 1), "peer-a") for seq in (1, 2, 3)]
    assert [True, True, False] == [d.catch_up for d in got if isinstance(d, Deliver)]


def test_a_peer_that_held_an_origins_second_message_first_makes_no_one_skip_the_first() -> None:
    """A relay linked just after the origin's first publish gets message 2 live, then 1 by
    anti-entropy; a home node that got 2 alone is behind it. The relay's ``ihave`` floor is
    the lowest it holds (1), so the home node asks for 1 instead of skipping it as if
    retention had removed it everywhere (the chaos test's lost message: once skipped,
    nothing asks for it again)."""
    relay, home = Gossip(lambda _id: False, 100), Gossip(lambda _id: False, 100)
    relay.committed([StoredMessage(1, signed(2))], linked=False)
    relay.committed([StoredMessage(2, signed(1))], linked=False)
    home.committed([StoredMessage(1, signed(2))], linked=False)
    advertised = relay.ihave()
    want = home.receive_ihave(advertised, now=0.0)
    assert (
        ({ORIGIN.node_id: 2}, {ORIGIN.node_id: 1}),
        IWant({ORIGIN.node_id: (1, 1)}),
        0,
    ) == (
        (advertised.heads, advertised.floors),
        want,
        home.tracker.heads.get(ORIGIN.node_id, 0),
    )


@given(st.permutations(list(range(1, 30))))
def test_the_floor_is_the_lowest_seq_held_whatever_the_arrival_order(order: list[int]) -> None:
    """Whatever order 1..29 arrive in, the floor a peer is told is 1."""
    tracker = OriginTracker()
    for seq in order:
        tracker.add("o", seq)
    assert 1 == tracker.floors["o"]


def test_a_restarted_node_that_never_got_message_1_makes_no_one_skip_it() -> None:
    """A node that held an origin's 2..5 (1 still to come by anti-entropy) and restarted
    starts from the log as it was (origin_start: nothing removed by retention): a peer
    that also missed 1 is not moved past it by its ``ihave`` (floor 2 would have), and a
    peer holding 1..5 is asked for 1."""
    restarted, behind = Gossip(lambda _id: False, 100), Gossip(lambda _id: False, 100)
    floor, head, above, _ = origin_start([2, 3, 4, 5], removed=Removed(0), above_max=100)
    restarted.tracker.load(ORIGIN.node_id, head, floor, above)
    behind.committed([StoredMessage(s, signed(s)) for s in (2, 3, 4, 5)], linked=False)
    told = restarted.ihave()
    behind.receive_ihave(told, now=0.0)
    asks = restarted.receive_ihave(IHave({ORIGIN.node_id: 5}, {ORIGIN.node_id: 1}), now=0.0)
    assert (
        ({ORIGIN.node_id: 0}, {ORIGIN.node_id: 1}),
        0,
        IWant({ORIGIN.node_id: (1, 1)}),
    ) == (
        (told.heads, told.floors),
        behind.tracker.heads.get(ORIGIN.node_id, 0),
        asks,
    )


def test_a_floor_retention_set_is_where_a_restarted_node_starts() -> None:
    """Retention removed 1..3 of 1..5: the restarted node says floor 4, head 5, and a peer
    with nothing of the origin skips to 4 and asks for 4..5."""
    restarted, fresh = Gossip(lambda _id: False, 100), Gossip(lambda _id: False, 100)
    floor, head, above, _ = origin_start([4, 5], removed=Removed(3), above_max=100)
    restarted.tracker.load(ORIGIN.node_id, head, floor, above)
    told = restarted.ihave()
    asks = fresh.receive_ihave(told, now=0.0)
    assert (
        ({ORIGIN.node_id: 5}, {ORIGIN.node_id: 4}),
        IWant({ORIGIN.node_id: (4, 5)}),
    ) == ((told.heads, told.floors), asks)


def test_a_skip_on_a_peers_floor_is_kept_for_the_log() -> None:
    """A peer's floor 50 moves a node with nothing of the origin to head 49, and the
    tracker keeps that skip for the glue to record (a restart starts past it); an
    ``ihave`` that moves nothing keeps nothing."""
    gossip = Gossip(lambda _id: False, 100)
    gossip.receive_ihave(IHave({"o": 60}, {"o": 50}), now=0.0)
    skipped = dict(gossip.tracker.skipped)
    gossip.tracker.skipped.clear()
    gossip.receive_ihave(IHave({"o": 60}, {"o": 50}), now=1.0)
    assert ({"o": 49}, {}, 49) == (skipped, gossip.tracker.skipped, gossip.tracker.heads["o"])


def restarted_around_a_hole() -> Gossip:
    """A node that held ORIGIN's 1..4 and 6..10 (5 never came), whose retention removed
    1..8, restarted: started from the log as it then is."""
    held = [1, 2, 3, 4, 6, 7, 8, 9, 10]
    removed = after_removal(Removed(0), [1, 2, 3, 4, 6, 7, 8], held)
    gossip = Gossip(lambda _id: False, 100)
    gossip.tracker.load(ORIGIN.node_id, *_start([9, 10], removed))
    return gossip


def _start(held: list[int], removed: Removed) -> tuple[int, int, list[int], list[tuple[int, int]]]:
    """``OriginTracker.load``'s arguments after the origin: head, floor, above, done."""
    floor, head, above, done = origin_start(held, removed, above_max=100)
    return head, floor, above, done


def test_a_floor_does_not_rise_over_a_hole_retention_removed_around() -> None:
    """The restarted node says floor 5, head 4 (not floor 9, head 10): a peer that holds
    1..4 is not moved past 5..8, and asks a peer holding 1..10 for all of 5..10 (from
    whom it gets 5, which no one else has)."""
    restarted = restarted_around_a_hole()
    behind = Gossip(lambda _id: False, 100)
    behind.committed([StoredMessage(s, signed(s)) for s in (1, 2, 3, 4)], linked=False)
    told = restarted.ihave()
    behind.receive_ihave(told, now=0.0)
    asks = behind.receive_ihave(IHave({ORIGIN.node_id: 10}, {ORIGIN.node_id: 1}), now=10.0)
    assert (
        ({ORIGIN.node_id: 4}, {ORIGIN.node_id: 5}),
        4,
        {},
        IWant({ORIGIN.node_id: (5, 10)}),
    ) == (
        (told.heads, told.floors),
        behind.tracker.heads[ORIGIN.node_id],
        behind.tracker.skipped,
        asks,
    )


def test_a_restarted_node_asks_only_for_its_hole_and_moves_over_what_it_removed() -> None:
    """The restarted node asks a peer holding 1..10 for 5 alone (6..8 it removed itself),
    and once 5 is in, its head moves over 6..8 and 9..10 to 10."""
    restarted = restarted_around_a_hole()
    asks = restarted.receive_ihave(IHave({ORIGIN.node_id: 10}, {ORIGIN.node_id: 1}), now=0.0)
    restarted.committed([StoredMessage(11, signed(5))], linked=False)
    assert (IWant({ORIGIN.node_id: (5, 5)}), 10, {}, 0) == (
        asks,
        restarted.tracker.heads[ORIGIN.node_id],
        restarted.tracker.done,
        restarted.tracker.above_count,
    )


def test_a_peers_floor_moves_a_restarted_node_over_its_removed_runs() -> None:
    """A peer whose retention removed everything below 9 moves the restarted node (head
    4, 6..8 removed, 9..10 held) to head 10 at once, its removed runs folded in."""
    restarted = restarted_around_a_hole()
    restarted.receive_ihave(IHave({ORIGIN.node_id: 10}, {ORIGIN.node_id: 9}), now=0.0)
    tracker = restarted.tracker
    assert (10, {}, {}, {ORIGIN.node_id: 8}) == (
        tracker.heads[ORIGIN.node_id],
        tracker.done,
        tracker.above,
        tracker.skipped,
    )


@given(
    st.sets(st.integers(1, 30)),
    st.sets(st.integers(1, 30)),
    st.permutations(list(range(1, 31))),
)
def test_a_restarted_node_holds_everything_once_its_holes_are_filled(
    came: set[int], removed_now: set[int], order: list[int]
) -> None:
    """Whatever came, whatever retention then removed: once every seq not held reaches
    the restarted node (in any order), its head is 30, nothing is left above it, and it
    never asked for a seq it removed itself."""
    held = sorted(came)
    gone = sorted(removed_now & came)
    record = after_removal(Removed(0), gone, held)
    kept = [s for s in held if s not in removed_now]
    gossip = Gossip(lambda _id: False, 100)
    gossip.tracker.load(ORIGIN.node_id, *_start(kept, record))
    asked: set[int] = set()
    for seq in order:
        want = gossip.tracker.missing(ORIGIN.node_id, 30)
        if want is not None:
            asked |= set(range(want[0], want[1] + 1))
        if seq not in came:
            gossip.tracker.add(ORIGIN.node_id, seq)
    tracker = gossip.tracker
    assert (30, {}, {}, 0, set()) == (
        tracker.heads.get(ORIGIN.node_id, 0),
        tracker.done,
        tracker.above,
        tracker.above_count,
        asked & set(gone),
    )
