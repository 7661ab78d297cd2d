"""A member's end of relayed traffic (spec §8): sessions per peer, route wrapping, and the
whole relayed pipeline from one path core to another. Pure: no sockets."""

from __future__ import annotations

import random
from collections.abc import Iterable

from hearthnet.identity import KeyPair
from hearthnet.mesh.path_frames import PAck, PFrame
from hearthnet.mesh.paths import Deliver, PathCore, Transmit
from hearthnet.mesh.relay_core import RelayCore, Send
from hearthnet.mesh.relay_frames import Attach, Route
from hearthnet.mesh.relay_member import EndpointConfig, RelayEndpoint

KA, KB, KR = (KeyPair.from_seed(bytes([0x21 + i]) * 32) for i in range(3))
A, B, R = KA.node_id, KB.node_id, KR.node_id
STRANGER = KeyPair.from_seed(b"\x7e" * 32)
NOW_MS = 1_763_800_000_000


def members(node: str) -> bool:
    """A, B and the relay are members; the stranger is not."""
    return node in {A, B, R}


def test_frames_wait_for_the_session_then_go_sealed() -> None:
    """The first frames to a peer go after a hello and its answer, in order."""
    ea, eb = RelayEndpoint(KA, members), RelayEndpoint(KB, members)
    first = ea.wrap(B, PFrame(1, b"x"), NOW_MS) + ea.wrap(B, PFrame(2, b"y"), NOW_MS)
    assert 1 == len(first)  # only the hello; both frames wait
    answer = eb.unwrap(first[0], NOW_MS)
    flushed = ea.unwrap(answer.routes[0], NOW_MS)
    got = [f for r in flushed.routes for f in eb.unwrap(r, NOW_MS).frames]
    assert [PFrame(1, b"x"), PFrame(2, b"y")] == got


def test_a_restarted_member_makes_new_keys_when_sealed_frames_arrive() -> None:
    """B restarts and cannot open A's frames; it says hello, and A's next frames open."""
    ea, eb = RelayEndpoint(KA, members), RelayEndpoint(KB, members)
    answer = eb.unwrap(ea.wrap(B, PAck(0), NOW_MS)[0], NOW_MS).routes[0]
    ea.unwrap(answer, NOW_MS)
    eb = RelayEndpoint(KB, members)  # restarted: no session any more
    lost = eb.unwrap(ea.wrap(B, PFrame(1, b"lost"), NOW_MS)[0], NOW_MS)
    assert lost.refused is not None
    reply = ea.unwrap(lost.routes[0], NOW_MS)  # A answers B's hello
    eb.unwrap(reply.routes[0], NOW_MS)
    again = [
        f for r in ea.wrap(B, PFrame(1, b"again"), NOW_MS) for f in eb.unwrap(r, NOW_MS).frames
    ]
    assert [PFrame(1, b"again")] == again


def test_a_hello_replayed_after_a_restart_does_not_wedge_the_pair() -> None:
    """B restarts; the relay replays A's old hello, so B holds keys A does not. After three
    sealed frames that do not verify B makes new keys, and A's frames open again."""
    ea, eb = RelayEndpoint(KA, members), RelayEndpoint(KB, members)
    old_hello = ea.wrap(B, PAck(0), NOW_MS)[0]
    ea.unwrap(eb.unwrap(old_hello, NOW_MS).routes[0], NOW_MS)
    eb = RelayEndpoint(KB, members)  # restarted
    eb.unwrap(old_hello, NOW_MS + 1000)  # the relay replays; B's answer goes nowhere
    refused, hellos = [], []
    for n in range(1, 4):
        out = eb.unwrap(ea.wrap(B, PFrame(n, b"f"), NOW_MS + 2000)[0], NOW_MS + 2000)
        refused.append(out.refused.code if out.refused else None)
        hellos += out.routes
    for route in ea.unwrap(hellos[0], NOW_MS + 2000).routes:
        eb.unwrap(route, NOW_MS + 2000)
    again = [
        f
        for r in ea.wrap(B, PFrame(4, b"again"), NOW_MS + 2000)
        for f in eb.unwrap(r, NOW_MS + 2000).frames
    ]
    assert (["invalid_signature"] * 3, 1, [PFrame(4, b"again")]) == (refused, len(hellos), again)


def test_a_strangers_route_is_refused_and_counted() -> None:
    """A hello from a node outside the served communities is unauthorized."""
    eb = RelayEndpoint(KB, members)
    hello = RelayEndpoint(STRANGER, lambda n: True).wrap(B, PAck(0), NOW_MS)[0]
    result = eb.unwrap(hello, NOW_MS)
    assert ("unauthorized", 1) == (
        result.refused.code if result.refused else None,
        eb.refused["unauthorized"],
    )


def test_a_misdelivered_route_is_refused() -> None:
    """A route for another node is bad_request, not opened."""
    ea = RelayEndpoint(KA, members)
    hello = ea.wrap(B, PAck(0), NOW_MS)[0]
    result = RelayEndpoint(KR, members).unwrap(hello, NOW_MS)
    assert ("bad_request", []) == (result.refused.code if result.refused else None, result.frames)


def test_an_unanswered_hello_is_sent_again() -> None:
    """No answer within 5 s: tick sends a new hello, not before."""
    ea = RelayEndpoint(KA, members)
    ea.wrap(B, PAck(0), NOW_MS)
    assert (0, 1) == (len(ea.tick(NOW_MS + 4_999)), len(ea.tick(NOW_MS + 5_000)))


def test_waiting_frames_are_bounded() -> None:
    """Past max_pending the oldest waiting frame is dropped (the sequence resends it)."""
    ea = RelayEndpoint(KA, members, EndpointConfig(max_pending=2))
    for s in (1, 2, 3):
        ea.wrap(B, PFrame(s, b""), NOW_MS)
    assert 1 == ea.dropped_pending


def with_one_gap(eb: RelayEndpoint) -> list[int]:
    """A sends B four frames; the relay drops the second: what B opens."""
    ea = RelayEndpoint(KA, members)
    answer = eb.unwrap(ea.wrap(B, PAck(0), NOW_MS)[0], NOW_MS).routes[0]
    for waited in ea.unwrap(answer, NOW_MS).routes:  # the ack that waited for the session
        eb.unwrap(waited, NOW_MS)
    sealed = [r for s in (1, 2, 3, 4) for r in ea.wrap(B, PFrame(s, b""), NOW_MS)]
    frames = [f for r in (sealed[0], sealed[2], sealed[3]) for f in eb.unwrap(r, NOW_MS).frames]
    return [f.s for f in frames if isinstance(f, PFrame)]


def test_gaps_are_counted_and_kept_when_a_session_is_forgotten() -> None:
    """A sealed frame the relay dropped leaves a gap before the next (counted once); the
    count stays when the session is forgotten or pushed out by a newer peer's."""
    forgets, evicts = (RelayEndpoint(KB, members, EndpointConfig(max_sessions=1)) for _ in "ab")
    opened = with_one_gap(forgets), with_one_gap(evicts)
    counted = forgets.gaps, evicts.gaps
    forgets.forget(A)
    evicts.wrap(R, PAck(0), NOW_MS)  # a session with R pushes A's out (max_sessions 1)
    assert (([1, 3, 4], [1, 3, 4]), (1, 1), (1, 1)) == (
        opened,
        counted,
        (forgets.gaps, evicts.gaps),
    )


def test_route_ids_differ() -> None:
    """Every route frame a member sends has a new id (the relays' seen-cache key)."""
    ea, eb = RelayEndpoint(KA, members), RelayEndpoint(KB, members)
    routes = ea.wrap(B, PAck(0), NOW_MS)
    routes += ea.unwrap(eb.unwrap(routes[0], NOW_MS).routes[0], NOW_MS).routes
    routes += [r for s in range(1, 5) for r in ea.wrap(B, PFrame(s, b""), NOW_MS)]
    assert len(routes) == len({r.id for r in routes})


def test_path_core_to_path_core_through_a_relay() -> None:
    """Path core to path core through endpoints and the relay core: in order, once, acknowledged."""
    relay = RelayCore(R, members)
    for node in (A, B):
        relay.link_up(node, node, "192.0.2.1:1000", 0.0)
        relay.receive(node, Attach(), 0.0)
    cores = {A: PathCore(A, [R], rng=random.Random(1)), B: PathCore(B, [R], rng=random.Random(2))}
    ends = {A: RelayEndpoint(KA, members), B: RelayEndpoint(KB, members)}
    for node in (A, B):
        cores[node].relay_attached(R, "192.0.2.1:1000", 0.01, 0.0)
    delivered: list[bytes] = []

    def run(node: str, actions: Iterable[object]) -> None:
        for x in actions:
            if isinstance(x, Transmit) and x.via == R:
                for route in ends[node].wrap(x.peer, x.frame, NOW_MS):
                    hop(node, route)
            elif isinstance(x, Deliver):
                delivered.append(x.frame)

    def hop(src: str, route: Route) -> None:
        for out in relay.receive(src, route, 1.0):
            assert isinstance(out, Send)
            assert isinstance(out.frame, Route)
            dst = str(out.link)
            opened = ends[dst].unwrap(out.frame, NOW_MS)
            assert opened.refused is None
            for r in opened.routes:
                hop(dst, r)
            for f in opened.frames:
                run(dst, cores[dst].receive(src, f, 1.0))

    sent = [f"frame {i}".encode() for i in range(40)]
    for frame in sent:
        run(A, cores[A].send(B, frame, 1.0))
    run(B, cores[B].tick(1.5))  # B acknowledges what it has not yet acknowledged
    assert (sent, 0) == (delivered, cores[A]._peers[B].out.unacked)


def test_only_the_sequences_frames_are_data_to_a_relay() -> None:
    """Hellos, acks and unsequenced heartbeats are marked control; numbered frames are not."""
    ea, eb = RelayEndpoint(KA, members), RelayEndpoint(KB, members)
    hello = ea.wrap(B, PFrame(1, b"x"), NOW_MS)[0]
    flushed = ea.unwrap(eb.unwrap(hello, NOW_MS).routes[0], NOW_MS).routes
    later = [ea.wrap(B, f, NOW_MS)[0] for f in (PFrame(2, b"y"), PAck(3), PFrame(0, b"ping"))]
    assert [True, False, False, True, True] == [r.control for r in (hello, *flushed, *later)]
