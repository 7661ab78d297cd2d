"""Relay frames and the end-to-end session through relays (spec §8). Pure: no sockets."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.errors import BadRequest, Expired, InvalidSignature, PayloadTooLarge, Replayed
from hearthnet.identity import KeyPair
from hearthnet.mesh.frame_fields import check_addr
from hearthnet.mesh.pacing import Budget
from hearthnet.mesh.path_frames import Candidates, Drain, PAck, PFrame, Punch, Upgrade
from hearthnet.mesh.protocol import FRAME_KINDS, decode_frame
from hearthnet.mesh.relay_e2e import TRANSITIONS, RelaySession, SessionState
from hearthnet.mesh.relay_frames import (
    RELAY_FRAME_KINDS,
    Attach,
    Attached,
    Detach,
    E2EHello,
    JoinAnswer,
    JoinVia,
    RelayFrame,
    Route,
    RouteError,
    RouteTable,
    Sealed,
    decode,
    parse_frame,
)

A = KeyPair.from_seed(b"\x61" * 32)
B = KeyPair.from_seed(b"\x62" * 32)
C = KeyPair.from_seed(b"\x63" * 32)
NOW = 1_763_800_000_000

node_ids = st.sampled_from([A.node_id, B.node_id, C.node_id])
ids = st.integers(0, 2**53 - 1)
small = st.integers(0, 2**40)
addrs = st.sampled_from(["203.0.113.7:4001", "[2001:db8::1]:443", "relay.example.org:1"])
punchable = st.sampled_from(["203.0.113.7:4001", "[2001:db8::1]:443"])  # IPs a punch may go to
nonces = st.text("0123456789abcdef", min_size=1, max_size=64)
blobs = st.binary(max_size=256)

frames: st.SearchStrategy[RelayFrame] = st.one_of(
    st.builds(Attach, st.none() | small),
    st.builds(
        Attached, node_ids, addrs, st.integers(1, 2**30), st.integers(1, 1024),
        st.integers(1, 65536), st.none() | small,
    ),
    st.builds(Budget, st.integers(1, 2**30), st.integers(1, 2**30)),
    st.builds(Detach, st.none() | st.sampled_from(["rate_limited", "unauthorized"]),
              st.text(max_size=20), st.none() | small),
    st.builds(Route, node_ids, node_ids, st.integers(0, 16), ids, blobs),
    st.builds(RouteError, node_ids, node_ids, ids,
              st.sampled_from(["unreachable", "ttl", "rate_limited"]), st.none() | small),
    st.builds(RouteTable, node_ids, ids,
              st.lists(st.tuples(node_ids, st.integers(0, 15)), max_size=5).map(tuple)),
    st.builds(Sealed, st.integers(1, 2**53 - 1), blobs, st.binary(min_size=16, max_size=16)),
    st.builds(JoinVia, ids, blobs),
    st.builds(JoinAnswer, ids, blobs),
    st.builds(Candidates, nonces, st.lists(punchable, min_size=1, max_size=8).map(tuple)),
    st.builds(Punch, nonces, st.integers(0, 10_000)),
    st.builds(Upgrade, nonces),
    st.builds(PFrame, st.integers(1, 2**53 - 1), blobs, small, small),
    st.builds(PAck, small, st.booleans(), small),
    st.builds(Drain, small, small),
)  # fmt: skip


@given(frames)
def test_every_frame_round_trips_through_cbor(frame: RelayFrame) -> None:
    """decode(encode(f)) == f for every relay frame."""
    assert frame == decode(frame.encode())


@given(frames)
def test_every_relay_frame_is_a_peer_link_frame(frame: RelayFrame) -> None:
    """Relay frames pass the peer link's decoder (their kinds are in FRAME_KINDS)."""
    assert frame.serialize() == decode_frame(frame.encode())


def test_relay_kinds_are_link_kinds() -> None:
    """Every relay frame kind is a known peer-link kind."""
    assert set() == RELAY_FRAME_KINDS - FRAME_KINDS


def test_a_signed_hello_round_trips_and_verifies() -> None:
    """An e2e_hello parses back equal, its signature verified."""
    hello = E2EHello.create(A, B.node_id, NOW, nonce="ab", their_nonce="cd", eph="x" * 43)
    assert hello == decode(hello.encode())


@pytest.mark.parametrize(
    ("field", "value"), [("to", C.node_id), ("ts", NOW + 1), ("eph", "y" * 43), ("nonce", "ef")]
)
def test_an_altered_hello_does_not_verify(field: str, value: Any) -> None:
    """Changing any signed field of an e2e_hello breaks its signature."""
    hello = E2EHello.create(A, B.node_id, NOW, nonce="ab", their_nonce=None, eph="x" * 43)
    wire = {**hello.serialize(), field: value}
    with pytest.raises(InvalidSignature):
        parse_frame(wire)


ROUTE = {"t": "route", "to": A.node_id, "from": B.node_id, "ttl_hops": 4, "id": 1, "inner": b""}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"ttl": 4}, "unknown field 'ttl' in route frame (ttl_hops?)"),
        ({"via": 1, "hop": 2}, "unknown fields 'via', 'hop' in route frame"),
        ({"to": "bob"}, "route.to must be a NodeID"),
        ({"from": [A.node_id]}, "route.from must be a NodeID"),
        ({"ttl_hops": 17}, "route.ttl_hops must be an integer in 0..16"),
        ({"ttl_hops": True}, "route.ttl_hops must be an integer in 0..16"),
        ({"id": -1}, f"route.id must be an integer in 0..{2**53 - 1}"),
        ({"id": 2**53}, f"route.id must be an integer in 0..{2**53 - 1}"),
        ({"inner": "text"}, "route.inner must be a byte string of at most 2096128 bytes"),
    ],
)
def test_a_malformed_route_is_refused_naming_the_field(patch: dict[str, Any], message: str) -> None:
    """Unknown fields and wrong types are bad_request naming the field."""
    with pytest.raises(BadRequest) as caught:
        parse_frame({**ROUTE, **patch})
    assert message == caught.value.message


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"t": "route_error", "to": A.node_id, "origin": B.node_id, "id": 1, "code": "gone"},
         "route_error.code must be one of ['rate_limited', 'ttl', 'unreachable']"),
        ({"t": "candidates", "nonce": "a", "addrs": []},
         "candidates.addrs must be a list of 1..8 addresses"),
        ({"t": "candidates", "nonce": "a", "addrs": ["1.2.3.4"]},
         "candidates.addrs[] must be an address host:port"),
        ({"t": "route_table", "relay": A.node_id, "version": 1, "nodes": [[A.node_id]]},
         "route_table.nodes entries must be [NodeID, hops]"),
        ({"t": "sealed", "s": 1, "f": b"", "m": b"short"},
         "sealed.m must be a byte string of 16 bytes"),
        ({"t": "sealed", "s": 0, "f": b"", "m": bytes(16)},
         f"sealed.s must be an integer in 1..{2**53 - 1}"),
        ({"t": "punch", "nonce": "a", "in_ms": 10_001},
         "punch.in_ms must be an integer in 0..10000"),
        ({"t": "hello"}, "not a relay frame kind: 'hello'"),
    ],
)  # fmt: skip
def test_other_malformed_frames_are_refused_by_name(obj: dict[str, Any], message: str) -> None:
    """Each frame's parse names what is wrong."""
    with pytest.raises(BadRequest) as caught:
        parse_frame(obj)
    assert message == caught.value.message


@pytest.mark.parametrize(
    ("addr", "ok"),
    [("1.2.3.4:80", True), ("[::1]:1", True), ("::1:80", False), ("h:0", False), (":80", False)],
)
def test_addresses_are_host_and_port(addr: str, ok: bool) -> None:
    """check_addr accepts host:port and bracketed IPv6 only."""
    try:
        check_addr(addr, "addr")
        accepted = True
    except BadRequest:
        accepted = False
    assert ok == accepted


def test_junk_bytes_are_bad_request() -> None:
    """Bytes that are not a CBOR map are refused."""
    with pytest.raises(BadRequest):
        decode(b"\xff\x00")
    with pytest.raises(BadRequest):
        decode(cbor2.dumps([1, 2]))


# -- the end-to-end session ------------------------------------------------------------


def established() -> tuple[RelaySession, RelaySession]:
    """Run the two hellos between A and B."""
    a, b = RelaySession(A, B.node_id), RelaySession(B, A.node_id)
    answer = b.receive(a.start(NOW), NOW).reply
    assert answer is not None
    a.receive(answer, NOW)
    return a, b


def test_sealed_frames_arrive_in_both_directions() -> None:
    """After the hellos each end opens what the other sealed."""
    a, b = established()
    got = [b.receive(a.seal(b"ping"), NOW).frame, a.receive(b.seal(b"pong"), NOW).frame]
    assert [b"ping", b"pong"] == got


def test_states_follow_the_table() -> None:
    """The session moves IDLE -> HELLO_SENT -> ESTABLISHED; IDLE cannot be re-entered."""
    a, _ = established()
    assert (SessionState.ESTABLISHED, set()) == (
        a.state,
        {SessionState.IDLE} & TRANSITIONS[SessionState.ESTABLISHED],
    )


def test_a_relay_cannot_forge_a_frame_without_the_keys() -> None:
    """A sealed frame made up by the relay (any MAC) is invalid_signature, counted."""
    _, b = established()
    with pytest.raises(InvalidSignature):
        b.receive(Sealed(1, b"evil", bytes(16)).encode(), NOW)
    assert 1 == b.altered


tampering = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("seq"), st.integers(1, 50), st.just(0)),
    st.tuples(st.just("replay"), st.integers(0, 50), st.just(0)),
)


@settings(max_examples=200)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=2, max_size=12), tampering, st.data())
def test_a_tampered_or_replayed_frame_is_always_refused(
    frames_sent: list[bytes], attack: tuple[str, int, int], data: st.DataObject
) -> None:
    """A relay's bit flip, new seq, replay or reorder is refused and counted, never handed on."""
    a, b = established()
    sealed = [a.seal(f) for f in frames_sent]
    at = data.draw(st.integers(1, len(sealed) - 1))
    for wire in sealed[:at]:
        b.receive(wire, NOW)
    kind, x, y = attack
    original = decode(sealed[at])
    assert isinstance(original, Sealed)
    if kind == "flip":
        raw = bytearray(original.f + original.m)
        raw[x % len(raw)] ^= y
        evil = Sealed(original.s, bytes(raw[: len(original.f)]), bytes(raw[len(original.f) :]))
    elif kind == "seq":
        evil = Sealed(original.s + x, original.f, original.m)
    else:  # an already accepted frame again: a replay, or an older one after a newer one
        evil = decode(sealed[x % at])  # type: ignore[assignment]
    before = (b.altered, b.replayed)
    with pytest.raises((InvalidSignature, Replayed)):
        b.receive(evil.encode(), NOW)
    assert 1 == (b.altered + b.replayed) - sum(before)
    assert frames_sent[at] == b.receive(sealed[at], NOW).frame


def test_a_dropped_frame_is_a_counted_gap() -> None:
    """Frames after one the relay dropped still arrive; the gap is counted."""
    a, b = established()
    first, _, third = a.seal(b"1"), a.seal(b"2"), a.seal(b"3")
    got = [b.receive(first, NOW).frame, b.receive(third, NOW).frame]
    assert ([b"1", b"3"], 1) == (got, b.gaps)


def test_frames_of_an_old_session_do_not_open_in_a_new_one() -> None:
    """After a new handshake, a frame recorded in the old session is refused."""
    a, b = established()
    old = a.seal(b"old")
    b.receive(old, NOW)
    answer = b.receive(a.start(NOW), NOW).reply
    assert answer is not None
    a.receive(answer, NOW)
    assert b"new" == b.receive(a.seal(b"new"), NOW).frame
    with pytest.raises((InvalidSignature, Replayed)):
        b.receive(old, NOW)


def test_frames_in_flight_across_a_rehandshake_still_open() -> None:
    """Frames A sealed before B's answer reached it open at B; then the new keys take over."""
    a, b = established()
    answer = b.receive(a.start(NOW), NOW).reply
    in_flight = a.seal(b"late")  # still under the old keys
    assert answer is not None
    a.receive(answer, NOW)
    got = [b.receive(in_flight, NOW).frame, b.receive(a.seal(b"next"), NOW).frame]
    got.append(a.receive(b.seal(b"back"), NOW).frame)
    assert [b"late", b"next", b"back"] == got


def test_a_replayed_hello_is_refused_and_keeps_the_session() -> None:
    """A relay that replays A's hello to B gets replayed; the live session goes on."""
    a, b = RelaySession(A, B.node_id), RelaySession(B, A.node_id)
    hello = a.start(NOW)
    answer = b.receive(hello, NOW).reply
    assert answer is not None
    a.receive(answer, NOW)
    with pytest.raises(Replayed):
        b.receive(hello, NOW)
    assert b"still" == b.receive(a.seal(b"still"), NOW).frame


def test_an_answer_to_someone_elses_hello_is_refused() -> None:
    """An answering hello that does not echo our nonce is replayed."""
    a, b = RelaySession(A, B.node_id), RelaySession(B, A.node_id)
    a.start(NOW)
    other = RelaySession(A, B.node_id)
    answer = b.receive(other.start(NOW), NOW).reply
    assert answer is not None
    with pytest.raises(Replayed):
        a.receive(answer, NOW)


def test_hellos_between_other_ends_or_stale_are_refused() -> None:
    """A hello for a third node is bad_request; one 61 s old is expired."""
    a = RelaySession(A, B.node_id)
    to_c = RelaySession(B, C.node_id).start(NOW)
    with pytest.raises(BadRequest):
        a.receive(to_c, NOW)
    stale = RelaySession(B, A.node_id).start(NOW - 61_000)
    with pytest.raises(Expired):
        a.receive(stale, NOW)


def test_simultaneous_starts_settle_on_the_lower_node_as_initiator() -> None:
    """Both ends start at once; one hello is answered and both can talk."""
    a, b = RelaySession(A, B.node_id), RelaySession(B, A.node_id)
    ha, hb = a.start(NOW), b.start(NOW)
    ra, rb = a.receive(hb, NOW).reply, b.receive(ha, NOW).reply
    answers = [r for r in (ra, rb) if r is not None]
    assert 1 == len(answers)
    low, high = (a, b) if A.node_id < B.node_id else (b, a)
    low.receive(answers[0], NOW)
    got = [high.receive(low.seal(b"x"), NOW).frame, low.receive(high.seal(b"y"), NOW).frame]
    assert [b"x", b"y"] == got


@settings(max_examples=200)
@given(
    st.integers(1, 10),
    st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.integers(0, 200)), max_size=30),
)
def test_whatever_a_relay_forwards_only_genuine_frames_open_in_order(
    n: int, forwarded: list[tuple[int, bool, int]]
) -> None:
    """A relay forwarding any mix of copies, reorderings and alterations gets only untouched
    frames opened, each at most once, in the order they were sealed."""
    a, b = established()
    originals = [f"frame {i}".encode() for i in range(n)]
    sealed = [a.seal(f) for f in originals]
    opened: list[bytes] = []
    for index, alter, position in forwarded:
        wire = bytearray(sealed[index % n])
        if alter:
            wire[position % len(wire)] ^= 0x40  # anywhere: header, seq, frame or MAC
        try:
            got = b.receive(bytes(wire), NOW).frame
        except (InvalidSignature, Replayed, BadRequest, PayloadTooLarge):
            continue
        assert got is not None
        opened.append(got)
    order = [originals.index(f) for f in opened]
    assert sorted(set(order)) == order
