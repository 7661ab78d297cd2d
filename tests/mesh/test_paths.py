"""A member's paths to its peers (spec §8): relay choice, direct upgrade, switch-over with
nothing lost or duplicated. Pure: no sockets, a fake clock."""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.errors import CapacityExceeded, Unavailable
from hearthnet.identity import KeyPair
from hearthnet.mesh.path_frames import Candidates, PAck, PFrame, Punch
from hearthnet.mesh.paths import (
    TRANSITIONS,
    UPGRADE_TRANSITIONS,
    Action,
    Deliver,
    PathChanged,
    PathConfig,
    PathCore,
    PathState,
    StartPunch,
    Transmit,
    UpgradeStep,
)
from hearthnet.mesh.pathseq import Inbound, Outbound, is_heartbeat
from hearthnet.mesh.protocol import encode_frame
from hearthnet.mesh.relay_choice import (
    RelayChoiceConfig,
)

_K = sorted(KeyPair.from_seed(bytes([0x51 + i]) * 32).node_id for i in range(2))
A, B = _K  # A < B: A leads upgrades
R, R2 = "relay-1", "relay-2"
ADDR_A, ADDR_B = "203.0.113.1:4000", "198.51.100.2:5000"


def core(
    node: str, relays: tuple[str, ...] = (R,), seed: int = 0, attach_target: int = 1, **cfg: Any
) -> PathCore:
    """A path core with a seeded random source."""
    choice = RelayChoiceConfig(attach_target=attach_target)
    return PathCore(
        node,
        relays,
        config=PathConfig(**cfg),
        rng=random.Random(seed),
        relay_config=choice,
    )


def kinds(actions: list[Action]) -> list[str]:
    """A short name per action: the frame kind of a Transmit, else the class."""
    out = []
    for a in actions:
        if isinstance(a, Transmit):
            out.append(f"{a.frame.KIND}@{a.via or 'direct'}")
        else:
            out.append(type(a).__name__)
    return out


# -- the tables -------------------------------------------------------------------------


def test_path_and_upgrade_tables_forbid_what_makes_no_sense() -> None:
    """DIRECT cannot go to UPGRADING; a finished attempt goes nowhere."""
    assert (False, frozenset(), frozenset()) == (
        PathState.UPGRADING in TRANSITIONS[PathState.DIRECT],
        UPGRADE_TRANSITIONS[UpgradeStep.SUCCEEDED],
        UPGRADE_TRANSITIONS[UpgradeStep.FAILED],
    )


def test_an_illegal_path_transition_raises() -> None:
    """Moving a peer along a transition the table lacks is a bug and raises."""
    c = core(A)
    c.direct_up(B, 0.0)
    with pytest.raises(RuntimeError):
        c._peers[B].move(PathState.UPGRADING, R)


# -- relayed paths --------------------------------------------------------------------------


def test_a_peer_is_down_until_a_relay_is_attached_and_nothing_sent_meanwhile_is_lost() -> None:
    """Frames sent while no path exists go out, in order, once a relay attaches."""
    a = core(A)
    a.connect(B, 0.0)
    held = a.send(B, b"one", 0.0) + a.send(B, b"two", 0.0)
    actions = a.relay_attached(R, ADDR_A, 0.02, 1.0)
    assert (
        (PathState.DOWN, None),
        [],
        [PathChanged(B, PathState.RELAYED, R), Transmit(B, R, PFrame(1, b"one")),
         Transmit(B, R, PFrame(2, b"two"))],
        (PathState.RELAYED, R),
    ) == (core(A).path(B), held, actions, a.path(B))  # fmt: skip


def test_sending_to_a_new_peer_opens_a_relayed_path() -> None:
    """The first frame to a peer not yet connected goes out through the primary relay."""
    a = core(A)
    a.relay_attached(R, ADDR_A, 0.01, 0.0)
    assert [PathChanged(B, PathState.RELAYED, R), Transmit(B, R, PFrame(1, b"hi"))] == a.send(
        B, b"hi", 1.0
    )


def test_a_frame_from_a_new_peer_is_delivered_and_acknowledged_through_the_relay() -> None:
    """A peer that reaches us first gets a path back, so its frames are acknowledged."""
    b = core(B)
    b.relay_attached(R, ADDR_B, 0.01, 0.0)
    got = b.receive(A, PFrame(1, b"hi"), 1.0)
    assert [PathChanged(A, PathState.RELAYED, R), Deliver(A, b"hi")] == got
    assert [Transmit(A, R, PAck(1))] == [x for x in b.tick(1.5) if isinstance(x, Transmit)]


def test_paths_are_kept_to_at_most_max_peers() -> None:
    """A peer past max_peers is capacity_exceeded until one is forgotten."""
    a = core(A, max_peers=1)
    a.connect(B, 0.0)
    with pytest.raises(CapacityExceeded):
        a.send("another", b"x", 0.0)
    a.forget(B)
    assert [] == a.send("another", b"x", 0.0)


def test_losing_the_relay_moves_peers_to_another_and_resends() -> None:
    """When R dies, peers move to R2 and every unacknowledged frame goes again through it."""
    a = core(A, (R, R2), attach_target=2)
    a.relay_attached(R, ADDR_A, 0.01, 0.0)
    a.relay_attached(R2, ADDR_A, 0.05, 0.0)
    a.connect(B, 0.0)
    a.send(B, b"x", 0.0)
    assert [PathChanged(B, PathState.RELAYED, R2), Transmit(B, R2, PFrame(1, b"x"))] == (
        a.relay_lost(R, 1.0)
    )


def test_losing_the_only_relay_takes_the_peer_down() -> None:
    """Without another relay the peer is down; a later attach resends."""
    a = core(A)
    a.relay_attached(R, ADDR_A, 0.01, 0.0)
    a.connect(B, 0.0)
    a.send(B, b"x", 0.0)
    down = a.relay_lost(R, 1.0)
    back = a.relay_attached(R, ADDR_A, 0.01, 2.0)
    assert (["PathChanged"], ["PathChanged", "pframe@relay-1"]) == (kinds(down), kinds(back))


# -- direct upgrade ------------------------------------------------------------------------


def pair(**cfg: Any) -> tuple[PathCore, PathCore]:
    """A and B, both attached to R and relayed to each other."""
    a, b = core(A, seed=1, **cfg), core(B, seed=2, **cfg)
    a.relay_attached(R, ADDR_A, 0.02, 0.0)
    b.relay_attached(R, ADDR_B, 0.02, 0.0)
    a.connect(B, 0.0)
    b.connect(A, 0.0)
    return a, b


def frames(actions: list[Action]) -> list[object]:
    """The frames of the Transmit actions."""
    return [a.frame for a in actions if isinstance(a, Transmit)]


def test_the_upgrade_exchanges_candidates_and_punches_at_the_same_moment() -> None:
    """Candidates through R, then punch after half the RTT: both ends start at the same moment."""
    a, b = pair()
    offer = a.tick(0.0)
    cand_a = frames(offer)[0]
    assert isinstance(cand_a, Candidates)
    answer = b.receive(A, cand_a, 0.020)  # 20 ms one way
    cand_b = frames(answer)[0]
    assert isinstance(cand_b, Candidates)
    lead = a.receive(B, cand_b, 0.040)
    punch = frames(lead)[0]
    assert isinstance(punch, Punch)
    follow = b.receive(A, punch, 0.060)
    start_a = next(x for x in lead if isinstance(x, StartPunch))
    start_b = next(x for x in follow if isinstance(x, StartPunch))
    assert (
        (ADDR_A,),
        (ADDR_B,),
        True,
        (PathState.UPGRADING, PathState.UPGRADING),
    ) == (
        start_b.addrs,
        start_a.addrs,
        math.isclose(start_a.at, start_b.at, rel_tol=1e-6),
        (a.path(B)[0], b.path(A)[0]),
    )


def test_a_successful_punch_goes_direct_and_keeps_the_relay_as_fallback() -> None:
    """After direct_up both ends are direct, R is the fallback, the upgrade is counted."""
    a, b = pair()
    upgrade(a, b)
    got_a, got_b = a.direct_up(B, 0.2), b.direct_up(A, 0.2)
    assert (
        ["PathChanged", "drain@relay-1", "upgrade@direct"],
        (PathState.DIRECT, R),
        (PathState.DIRECT, R),
        (1, 1),
        (1, 1),
    ) == (
        kinds(got_a),
        a.path(B),
        b.path(A),
        (a.stats.upgrades_tried, a.stats.upgrades_succeeded),
        (b.stats.upgrades_tried, b.stats.upgrades_succeeded),
    )
    assert ["PathChanged", "drain@relay-1", "upgrade@direct"] == kinds(got_b)


def upgrade(a: PathCore, b: PathCore, now: float = 0.0) -> None:
    """Run the candidate/punch exchange up to the scheduled punch."""
    cand_a = frames(a.tick(now))[0]
    cand_b = frames(b.receive(A, cand_a, now + 0.02))[0]  # type: ignore[arg-type]
    punch = frames(a.receive(B, cand_b, now + 0.04))[0]  # type: ignore[arg-type]
    b.receive(A, punch, now + 0.06)  # type: ignore[arg-type]


def test_statistics_count_peers_per_path_and_upgrades() -> None:
    """The snapshot shows one peer direct after a successful upgrade, one relayed."""
    a, b = pair()
    upgrade(a, b)
    a.direct_up(B, 0.2)
    a.connect("relay-only-peer", 0.3)
    snap = a.statistics()
    assert (1, 1, 0, 0, 1, 1) == (
        snap.direct,
        snap.relayed,
        snap.upgrading,
        snap.down,
        snap.upgrades_tried,
        snap.upgrades_succeeded,
    )


def test_a_failed_punch_stays_relayed_and_retries_after_a_growing_backoff() -> None:
    """punch_failed: relayed again; the next attempt waits ~30 s, then ~60 s."""
    a, b = pair(jitter=0.0)
    upgrade(a, b)
    nonce = a._peers[B].attempt.nonce  # type: ignore[union-attr]
    back = a.punch_failed(B, nonce, 1.0)
    early, first_retry = a.tick(30.0), a.tick(31.0)
    a.punch_failed(B, a._peers[B].attempt.nonce, 31.0)  # type: ignore[union-attr]
    assert (
        [PathChanged(B, PathState.RELAYED, R)],
        [],
        ["PathChanged", "candidates@relay-1"],
        91.0,
    ) == (back, kinds(early), kinds(first_retry), a._peers[B].next_upgrade)


def test_an_upgrade_that_never_connects_times_out() -> None:
    """No direct link within 10 s of the start: the attempt fails, the peer stays relayed."""
    a, b = pair()
    upgrade(a, b)
    a.tick(5.0)
    assert [PathChanged(B, PathState.RELAYED, R)] == [
        x for x in a.tick(10.5) if isinstance(x, PathChanged)
    ]


def test_a_follower_takes_up_the_leaders_new_attempt() -> None:
    """Candidates with a new nonce replace the follower's unfinished attempt."""
    a, b = pair()
    first = frames(a.tick(0.0))[0]
    b.receive(A, first, 0.02)  # type: ignore[arg-type]
    answer = b.receive(A, Candidates("second", (ADDR_A,)), 11.0)
    assert (["PathChanged", "PathChanged", "candidates@relay-1"], "second") == (
        kinds(answer),
        b._peers[A].attempt.nonce,  # type: ignore[union-attr]
    )


def test_stale_upgrade_frames_are_ignored_and_counted() -> None:
    """A punch for another attempt, or candidates to the leader unasked, change nothing."""
    a, b = pair()
    got = [b.receive(A, Punch("nope", 10), 0.0), a.receive(B, Candidates("x", (ADDR_B,)), 0.0)]
    assert ([[], []], 1, 1) == (got, b.stats.stale_upgrade_frames, a.stats.stale_upgrade_frames)


def test_the_direct_link_dying_falls_back_to_the_relay_and_resends() -> None:
    """direct_down: relayed through the fallback, unacknowledged frames resent through it."""
    a, _b = pair()
    a.direct_up(B, 0.0)
    a.send(B, b"x", 0.1)
    assert [PathChanged(B, PathState.RELAYED, R), Transmit(B, R, PFrame(1, b"x"))] == (
        a.direct_down(B, 0.2)
    )


def test_a_direct_link_without_relays_needs_none() -> None:
    """A peer reached directly with no relay attached goes down when the link dies."""
    a = core(A)
    a.direct_up(B, 0.0)
    assert ((PathState.DIRECT, None), [PathChanged(B, PathState.DOWN, None)]) == (
        a.path(B),
        a.direct_down(B, 1.0),
    )


# -- the sequence across paths ------------------------------------------------------------


def test_out_of_order_frames_are_delivered_in_order_once() -> None:
    """3 before 2 is held; 2 then releases both; a repeat of 2 is a counted duplicate."""
    inb = Inbound()
    got = [inb.receive(PFrame(s, bytes([s])))[0] for s in (1, 3, 2, 2)]
    assert ([[b"\x01"], [], [b"\x02", b"\x03"], []], 1) == (got, inb.duplicates)


def test_frames_held_out_of_order_are_bounded_in_bytes_too() -> None:
    """Past max_ahead_bytes a frame ahead is not held (its resend brings it); what is
    delivered frees its bytes for the next."""
    inb = Inbound(max_ahead_bytes=1000)
    held = [inb.receive(PFrame(s, bytes(400)))[0] for s in (2, 3, 4)]  # the third does not fit
    first = inb.receive(PFrame(1, b"a"))[0]
    later = [inb.receive(PFrame(s, bytes(400)))[0] for s in (5, 4)]
    assert ([[], [], []], [b"a", bytes(400), bytes(400)], [[], [bytes(400), bytes(400)]]) == (
        held,
        first,
        later,
    )


def test_a_heartbeat_goes_outside_the_sequence_past_a_gap() -> None:
    """A ping behind a lost frame is handed on at once, neither kept nor acknowledged."""
    out, inb = Outbound(), Inbound(ack_every=1)
    ping = encode_frame("ping", seq=1, ts=0)
    sent = [out.send(b"data 1", 0.0), out.send(b"data 2", 0.0), out.unsequenced(ping)]
    got = [inb.receive(f) for f in (sent[1], sent[2])]  # data 1 was lost
    assert ((True, False), [([], None), ([ping], None)], 2) == (
        (is_heartbeat(ping), is_heartbeat(b"data 1")),
        got,
        out.unacked,
    )


def test_a_drain_ack_below_the_drained_mark_resends_the_lost_frames() -> None:
    """The old path lost frame 2 of 3: the answer to the drain makes the sender resend it."""
    out, inb = Outbound(), Inbound()
    sent = [out.send(bytes([i]), 0.0) for i in (1, 2, 3)]
    inb.receive(sent[0])
    drain = out.drain()
    inb.receive(sent[2])
    ack = inb.drain(drain)
    assert (PAck(1, drained=True), [PFrame(2, b"\x02", a=1), PFrame(3, b"\x03", a=1)]) == (
        ack,
        out.ack(ack, 0.1),
    )


def test_an_ordinary_ack_does_not_resend() -> None:
    """An ack that does not answer a drain releases frames and resends nothing."""
    out = Outbound()
    for i in range(3):
        out.send(bytes([i]), 0.0)
    out.drain()
    assert ([], 1) == (out.ack(PAck(2), 0.1), out.unacked)


def test_unacknowledged_frames_are_resent_after_two_seconds() -> None:
    """Frames not acknowledged within retransmit_s come back from due()."""
    out = Outbound()
    out.send(b"a", 0.0)
    assert ([], [PFrame(1, b"a")], []) == (out.due(1.9), out.due(2.0), out.due(3.0))


def test_a_restarted_sender_starts_a_new_sequence() -> None:
    """Frames of a later epoch restart the count; late frames of the old epoch are stale."""
    inb = Inbound()
    old = Outbound(epoch=100)
    for _ in range(3):
        inb.receive(old.send(b"old", 0.0))
    new = Outbound(epoch=200)
    first = inb.receive(new.send(b"new", 0.0))[0]
    late = inb.receive(PFrame(4, b"late", e=100))[0]
    assert ([b"new"], [], 1) == (first, late, inb.stale)


def test_a_restarted_receiver_resumes_after_what_it_acknowledged() -> None:
    """A receiver with no state skips what the sender says was acknowledged already."""
    out = Outbound(epoch=7)
    for i in range(5):
        out.send(bytes([i]), 0.0)
    out.ack(PAck(3, e=7), 0.0)
    fresh = Inbound()  # the receiver restarted after acknowledging 1..3
    resent = out.resend_all(1.0)
    got = [f for pf in resent for f in fresh.receive(pf)[0]]
    assert ([b"\x03", b"\x04"], 5) == (got, fresh.delivered)


def test_acks_for_another_epoch_are_ignored() -> None:
    """An ack naming a sequence before our restart releases nothing."""
    out = Outbound(epoch=2)
    out.send(b"x", 0.0)
    out.ack(PAck(1, e=1), 0.0)
    assert 1 == out.unacked


def test_a_peer_that_acknowledges_nothing_is_unavailable() -> None:
    """Past max_unacked frames sending raises unavailable."""
    out = Outbound(max_unacked=2)
    out.send(b"a", 0.0)
    out.send(b"b", 0.0)
    with pytest.raises(Unavailable):
        out.send(b"c", 0.0)


def test_frames_far_ahead_are_dropped_for_resending() -> None:
    """A frame beyond the reorder window is not held (bounded memory)."""
    inb = Inbound(max_ahead=4)
    inb.receive(PFrame(10, b"x"))
    assert ([b"1"], 1) == (inb.receive(PFrame(1, b"1"))[0], inb.delivered)


class Net:
    """Two path cores joined by FIFO paths that can die: the relay R and a direct link."""

    def __init__(self) -> None:
        self.a, self.b = pair(upgrade_timeout_s=3.0)
        self.now = 0.0
        self.alive = {R}
        self.queues: dict[tuple[str, str], deque[object]] = {}
        self.sent: list[bytes] = []
        self.delivered: list[bytes] = []

    def carry(self, src: str, actions: list[Action]) -> None:
        """Carry out one core's actions: queue frames on live paths, record deliveries."""
        for x in actions:
            if isinstance(x, Transmit):
                path = x.via or "direct"
                if path in self.alive:
                    self.queues.setdefault((path, x.peer), deque()).append(x.frame)
            elif isinstance(x, Deliver):
                self.delivered.append(x.frame)

    def step(self, op: tuple[str, int]) -> None:
        """Apply one event."""
        kind, arg = op
        a, b = self.a, self.b
        if kind == "send":
            frame = len(self.sent).to_bytes(4, "big")
            self.sent.append(frame)
            self.carry(A, a.send(B, frame, self.now))
        elif kind == "deliver":
            self.deliver((R, "direct")[arg % 2], (A, B)[arg // 2 % 2])
        elif kind == "direct_up" and "direct" not in self.alive:
            self.alive.add("direct")
            self.carry(A, a.direct_up(B, self.now))
            self.carry(B, b.direct_up(A, self.now))
        elif kind == "direct_down" and "direct" in self.alive:
            self.kill("direct")
            self.carry(A, a.direct_down(B, self.now))
            self.carry(B, b.direct_down(A, self.now))
        elif kind == "relay_dies" and R in self.alive:
            self.kill(R)
            self.carry(A, a.relay_lost(R, self.now))
            self.carry(B, b.relay_lost(R, self.now))
        elif kind == "relay_back" and R not in self.alive:
            self.alive.add(R)
            self.carry(A, a.relay_attached(R, ADDR_A, 0.02, self.now))
            self.carry(B, b.relay_attached(R, ADDR_B, 0.02, self.now))
        elif kind == "tick":
            self.now += arg / 2
            self.carry(A, a.tick(self.now))
            self.carry(B, b.tick(self.now))

    def kill(self, path: str) -> None:
        """A path dies with everything in flight on it."""
        self.alive.discard(path)
        for key in [k for k in self.queues if k[0] == path]:
            del self.queues[key]

    def deliver(self, path: str, to: str) -> None:
        """The next frame on ``path`` towards ``to`` arrives."""
        q = self.queues.get((path, to))
        if not q:
            return
        frame = q.popleft()
        receiver, sender = (self.b, A) if to == B else (self.a, B)
        self.carry(to, receiver.receive(sender, frame, self.now))  # type: ignore[arg-type]

    def settle(self) -> None:
        """Heal: the relay back, everything in flight delivered, time passing for resends."""
        self.step(("relay_back", 0))
        for _ in range(50):
            self.flush()
            self.step(("tick", 6))

    def flush(self) -> None:
        """Deliver everything in flight, and what that answers, on every path."""
        while any(self.queues.values()):
            for path, to in list(self.queues):
                self.deliver(path, to)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.just(0)),
        st.tuples(st.just("deliver"), st.integers(0, 3)),
        st.tuples(st.just("deliver"), st.integers(0, 3)),
        st.tuples(st.sampled_from(["direct_up", "direct_down", "relay_dies", "relay_back"]),
                  st.just(0)),
        st.tuples(st.just("tick"), st.integers(0, 6)),
    ),
    max_size=120,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(ops)
def test_switching_paths_loses_and_duplicates_nothing(events: list[tuple[str, int]]) -> None:
    """Any mix of sends, deliveries, upgrades and dying paths delivers all, in order, once."""
    net = Net()
    for op in events:
        net.step(op)
        assert net.sent[: len(net.delivered)] == net.delivered
    net.settle()
    assert net.sent == net.delivered


def test_a_clean_upgrade_moves_frames_without_resending_any() -> None:
    """Relayed to direct, both paths alive: direct frames wait for relayed ones; no resends."""
    net = Net()
    for _ in range(5):
        net.step(("send", 0))
    net.step(("direct_up", 0))
    for _ in range(5):
        net.step(("send", 0))
    for _ in range(5):
        net.step(("deliver", 3))  # the direct frames reach B first: held back
    held = list(net.delivered)
    net.flush()  # then the relay's five, the drain, and its ack
    assert ([], net.sent, 0) == (held, net.delivered, net.a.stats.resent)


def test_a_peer_is_settled_once_it_acknowledged_the_relayed_sequence() -> None:
    """After an upgrade, frames continue the sequence on the direct link; the peer is
    settled (plain frames may follow) only when every one of them was delivered."""
    net = Net()
    for _ in range(3):
        net.step(("send", 0))
    net.step(("direct_up", 0))
    net.step(("send", 0))
    before = net.a.settled(B)
    net.flush()  # the relay's three and the drain, the direct one, and the acks
    net.step(("tick", 1))
    net.flush()
    assert (False, True, net.sent) == (before, net.a.settled(B), net.delivered)
