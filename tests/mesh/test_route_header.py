"""The binary route frame (spec §8 as built, ``hearthnet-peer.v2``): its fixed header, the
bytes a relay passes on, the CBOR map for v1 peers, and what binds the header to the
sealed frame behind it. Pure: no sockets."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.errors import BadRequest
from hearthnet.identity import KeyPair
from hearthnet.ids import public_key_from_node_id
from hearthnet.mesh.frame_fields import MAX_ID
from hearthnet.mesh.path_frames import PAck, PFrame
from hearthnet.mesh.protocol import decode_frame
from hearthnet.mesh.relay_frames import Route, parse_frame
from hearthnet.mesh.relay_member import RelayEndpoint
from hearthnet.mesh.route_header import (
    FROM_AT,
    HEADER_BYTES,
    TO_AT,
    TTL_AT,
    RouteHeader,
    encode_route,
    header_of,
    is_binary,
    parse_route,
    passed_on,
    read_header,
    v1_bytes,
)

KA, KB, KC = (KeyPair.from_seed(bytes([0x91 + i]) * 32) for i in range(3))
A, B, C = KA.node_id, KB.node_id, KC.node_id
NOW_MS = 1_763_800_000_000

routes = st.builds(
    Route,
    st.sampled_from([A, B, C]),
    st.sampled_from([A, B, C]),
    st.integers(0, 16),
    st.integers(0, MAX_ID),
    st.binary(max_size=600),
    st.booleans(),
)


@given(routes)
def test_a_route_round_trips_through_the_binary_form(route: Route) -> None:
    """parse_route(encode_route(r)) == r, and the header alone reads the same fields."""
    data = encode_route(route)
    assert (route, header_of(route), True) == (
        parse_route(data),
        read_header(data),
        is_binary(data),
    )


@given(routes)
def test_a_route_is_its_inner_frame_behind_81_bytes(route: Route) -> None:
    """The layout of spec §8: tag, layout 1, kind 1, flags, ttl, id, to, from, length."""
    data = encode_route(route)
    fields = struct.unpack_from(">BBBBBQ32s32sI", data)
    expected = (0x48, 1, 1, int(route.control), route.ttl_hops, route.id)
    assert (expected, len(route.inner), route.inner) == (
        fields[:6],
        fields[8],
        data[HEADER_BYTES:],
    )


@settings(max_examples=50)
@given(routes.filter(lambda r: r.ttl_hops > 0))
def test_a_passed_on_frame_differs_only_in_its_ttl_byte(route: Route) -> None:
    """What a relay writes on is the received bytes with ttl_hops one less."""
    data = encode_route(route)
    out = passed_on(data, read_header(data))
    changed = [i for i, (x, y) in enumerate(zip(data, out, strict=True)) if x != y]
    hop = Route(route.to, route.from_, route.ttl_hops - 1, route.id, route.inner, route.control)
    assert ([TTL_AT], hop) == (changed, parse_route(out))


def test_a_v1_peer_gets_the_cbor_map_without_control() -> None:
    """v1_bytes is the CBOR map a hearthnet-peer.v1 node parses; control is left out."""
    data = v1_bytes(Route(B, A, 3, 42, b"sealed", control=True))
    wire = decode_frame(data)
    assert (Route(B, A, 3, 42, b"sealed"), False, False) == (
        parse_frame(wire),
        "control" in wire,
        is_binary(data),
    )


def _with(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


GOOD = encode_route(Route(B, A, 4, 7, b"x" * 10))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (GOOD[:80], "at least 81 bytes"),
        (_with(GOOD, 1, b"\x02"), "layout 1"),
        (_with(GOOD, 2, b"\x02"), "layout 1"),
        (_with(GOOD, 3, b"\x02"), "route.flags"),
        (_with(GOOD, TTL_AT, b"\x11"), "route.ttl_hops"),
        (_with(GOOD, 5, (MAX_ID + 1).to_bytes(8, "big")), "route.id"),
        (GOOD + b"!", "route.length"),
        (GOOD[:-1], "route.length"),
        (_with(GOOD, 77, (11).to_bytes(4, "big")), "route.length"),
    ],
    ids=["short", "layout", "kind", "flags", "ttl", "id", "longer", "shorter", "length"],
)
def test_a_malformed_header_is_refused_naming_the_field(data: bytes, message: str) -> None:
    """Each field out of range is bad_request naming it."""
    with pytest.raises(BadRequest) as caught:
        read_header(data)
    assert message in str(caught.value)


def test_every_cbor_map_is_told_from_a_binary_frame() -> None:
    """The first byte of a CBOR map (0xa0..0xbf) is never the binary tag."""
    assert [False] * 32 == [is_binary(bytes((b,)) + b"x") for b in range(0xA0, 0xC0)]


def test_the_header_is_a_tuple_of_the_six_fields() -> None:
    """read_header gives to, from, ttl_hops, id, control and the inner size."""
    assert RouteHeader(B, A, 4, 7, False, 10) == read_header(GOOD)


def session_pair() -> tuple[RelayEndpoint, RelayEndpoint, RelayEndpoint]:
    """A and C each with an established session to B."""
    ea, eb, ec = (RelayEndpoint(k, lambda n: True) for k in (KA, KB, KC))
    for sender in (ea, ec):
        hello = sender.wrap(B, PAck(0), NOW_MS)[0]
        for back in eb.unwrap(hello, NOW_MS).routes:
            sender.unwrap(back, NOW_MS)
    return ea, eb, ec


def rewritten(data: bytes, at: int, node: str) -> Route:
    """``data`` with the key at ``at`` (to or from) replaced by ``node``'s."""
    return parse_route(_with(data, at, public_key_from_node_id(node)))


D = KeyPair.from_seed(b"\x99" * 32).node_id  # a member B holds no session with


@pytest.mark.parametrize(
    ("field", "node", "receiver", "code"),
    [
        ("from", C, "b", "invalid_signature"),  # B opens it with C's keys: no
        ("from", D, "b", "invalid_signature"),  # B holds no keys for D
        ("from", B, "b", "bad_request"),  # from B to B
        ("to", C, "c", "invalid_signature"),  # C holds no keys for A
    ],
)
def test_a_relay_that_rewrites_from_or_to_gets_the_frame_refused(
    field: str, node: str, receiver: str, code: str
) -> None:
    """A genuine sealed frame A -> B with from or to rewritten opens nowhere: ``inner`` is
    sealed under keys only A and B hold, picked by from at the node to names."""
    ea, eb, ec = session_pair()
    data = encode_route(ea.wrap(B, PFrame(1, b"pay"), NOW_MS)[0])
    forged = rewritten(data, FROM_AT if field == "from" else TO_AT, node)
    opened = {"b": eb, "c": ec}[receiver].unwrap(forged, NOW_MS)
    genuine = eb.unwrap(parse_route(data), NOW_MS)
    assert ([], code, [PFrame(1, b"pay")]) == (
        opened.frames,
        opened.refused.code if opened.refused else None,
        genuine.frames,
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(TO_AT, FROM_AT + 31), st.integers(0, 7))
def test_any_bit_of_to_or_from_flipped_is_refused(at: int, bit: int) -> None:
    """One bit of to or from changed: the frame is not opened by its addressee."""
    ea, eb, _ = session_pair()
    data = encode_route(ea.wrap(B, PFrame(1, b"pay"), NOW_MS)[0])
    forged = parse_route(_with(data, at, bytes((data[at] ^ (1 << bit),))))
    opened = eb.unwrap(forged, NOW_MS)
    assert ([], True) == (opened.frames, opened.refused is not None)
