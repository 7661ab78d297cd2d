"""Presence and membership flooding: each flood is applied and sent on once. Pure."""

from __future__ import annotations

from hearthnet.mesh.actions import Admit, ApplyPresence, Forward
from hearthnet.mesh.flood import MembershipFlood, PresenceFlood
from hearthnet.mesh.frames import MembershipBatch, Presence

EVENT = {"topic": "room.a", "kind": "join", "member": {"client_id": "c1"}}


def test_a_presence_flood_is_applied_and_forwarded_once() -> None:
    """The first copy is applied and sent on past its source; a second copy is dropped."""
    flood = PresenceFlood("ed25519:me")
    frame = Presence("01JFLOOD", "ed25519:them", (EVENT,))
    first = flood.receive(frame, "ed25519:them")
    again = flood.receive(frame, "ed25519:other")
    assert ((ApplyPresence((EVENT,)), Forward(frame.encode(), "ed25519:them")), None) == (
        first,
        again,
    )


def test_our_own_flood_does_not_come_back() -> None:
    """A flood this node started is not applied when a peer sends it back."""
    flood = PresenceFlood("ed25519:me")
    frame = flood.start([EVENT])
    assert ("ed25519:me", None) == (frame.node, flood.receive(frame, "ed25519:them"))


def test_the_seen_cache_is_bounded() -> None:
    """Past seen_max ids, the oldest flood is forgotten (and would be taken again)."""
    flood = PresenceFlood("ed25519:me", seen_max=2)
    frames = [Presence(f"id{i}", None, ()) for i in range(3)]
    for frame in frames:
        flood.receive(frame, "p")
    assert (True, False) == (
        flood.receive(frames[0], "p") is not None,
        flood.receive(frames[2], "p") is not None,
    )


def test_membership_admits_only_records_not_held_up_to_the_cap() -> None:
    """Records already held are skipped; at most per_request are taken from one frame."""
    flood = MembershipFlood(per_request=2)
    frame = MembershipBatch(({"id": "r1"}, {"id": "r2"}, {"id": "r3"}))
    assert (Admit("p", ({"id": "r2"},)), None) == (
        flood.receive(frame, "p", {"r1"}),
        flood.receive(frame, "p", {"r1", "r2"}),
    )


def test_a_membership_snapshot_is_cut_at_the_cap() -> None:
    """Five records at a cap of two go out in frames of 2, 2 and 1."""
    records = [{"id": f"r{i}"} for i in range(5)]
    frames = MembershipFlood(per_request=2).snapshot(records)
    assert [2, 2, 1] == [len(f.records) for f in frames]
