"""The peer handshake and link frames (spec §7.2). Pure: no sockets."""

from __future__ import annotations

import pytest

from hearthnet.errors import (
    BadRequest,
    Expired,
    InternalError,
    InvalidSignature,
    PayloadTooLarge,
    Revoked,
    Unauthorized,
    WireError,
)
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.protocol import (
    SUBPROTOCOLS,
    TRANSITIONS,
    Handshake,
    LinkState,
    LinkToSelf,
    PeerInfo,
    bye_for,
    decode_frame,
    encode_frame,
    link_version,
    refusal_from_bye,
    winning_direction,
)

A = KeyPair.from_seed(b"\x61" * 32)
B = KeyPair.from_seed(b"\x62" * 32)
C = KeyPair.from_seed(b"\x63" * 32)
NOW = 1_763_800_000_000


def community(*members: KeyPair, revoked: tuple[KeyPair, ...] = ()) -> Membership:
    """A's community with the given members."""
    view = Membership(A.node_id)
    view.add(view.sign(A, "community.created", A.node_id, now_ms=1))
    for i, m in enumerate(members):
        view.add(view.sign(A, "member.added", m.node_id, now_ms=2 + i))
    for i, r in enumerate(revoked):
        view.add(view.sign(A, "member.revoked", r.node_id, now_ms=50 + i))
    return view


def run(dialer: Handshake, acceptor: Handshake, tamper: object = None) -> None:
    """Drive the three hellos; ``tamper`` may rewrite a frame dict in flight."""
    h1 = decode_frame(dialer.start())
    h2 = acceptor.receive(h1 if tamper is None else tamper(1, h1), NOW)  # type: ignore[operator]
    assert h2 is not None
    f2 = decode_frame(h2)
    h3 = dialer.receive(f2 if tamper is None else tamper(2, f2), NOW)  # type: ignore[operator]
    assert h3 is not None
    f3 = decode_frame(h3)
    assert acceptor.receive(f3 if tamper is None else tamper(3, f3), NOW) is None  # type: ignore[operator]


def test_members_complete_the_handshake() -> None:
    """Three hellos; both sides know who the other is."""
    view = community(B)
    dialer = Handshake(A, view, True, NOW, name="a", url="http://127.0.0.1:1")
    acceptor = Handshake(B, view, False, NOW, name="b")
    run(dialer, acceptor)
    assert (True, True, B.node_id, A.node_id, "http://127.0.0.1:1") == (
        dialer.done,
        acceptor.done,
        dialer.peer.node if dialer.peer else None,
        acceptor.peer.node if acceptor.peer else None,
        acceptor.peer.url if acceptor.peer else None,
    )


def test_what_a_peer_is_sent_follows_the_link_version_not_the_hello() -> None:
    """On a v4 link the peer takes route batches, batch frames and data_enc messages; on a
    v3 link no route batches; on a v2 link none of them (a "+batch" label in its version
    counts for nothing); a relayed path takes data_enc messages only; the negotiated
    subprotocol names the version."""
    view = community(B)
    seen = []
    for link, version in ((4, "0.3.0"), (3, "0.3.0"), (2, "0.3.0+batch")):
        dialer = Handshake(A, view, True, NOW, version=version, link=link)
        acceptor = Handshake(B, view, False, NOW, version=version, link=link)
        run(dialer, acceptor)
        peer = acceptor.peer
        seen.append(
            (peer.link, peer.takes_route_batches, peer.takes_batches, peer.takes_binary)
            if peer
            else None
        )
    relayed = PeerInfo(B.node_id, "", None, "")
    seen.append(
        (relayed.link, relayed.takes_route_batches, relayed.takes_batches, relayed.takes_binary)
    )
    versions = [link_version(p) for p in (*SUBPROTOCOLS, None)]
    expected = [
        (4, True, True, True),
        (3, False, True, True),
        (2, False, False, False),
        (0, False, False, True),
    ]
    assert (expected, [5, 4, 3, 2, 1, 1]) == (seen, versions)


def test_a_full_acceptor_says_so_in_its_signed_hello() -> None:
    """The dialer learns from H2 that no link will follow (addresses and bye instead)."""
    view = community(B)
    seen = []
    for full in (False, True):
        dialer = Handshake(A, view, True, NOW)
        acceptor = Handshake(B, view, False, NOW, full=full)
        run(dialer, acceptor)
        seen.append((dialer.peer.full if dialer.peer else None, acceptor.done))
    assert [(False, True), (True, True)] == seen


def test_the_full_flag_is_signed() -> None:
    """A hello whose full flag was added in flight fails its signature."""

    def add_full(step: int, frame: dict[str, object]) -> dict[str, object]:
        return {**frame, "full": True} if step == 2 else frame

    view = community(B)
    with pytest.raises(InvalidSignature):
        run(Handshake(A, view, True, NOW), Handshake(B, view, False, NOW), add_full)


@pytest.mark.parametrize(
    ("members", "revoked", "error"),
    [
        ((), (), Unauthorized),  # B is not a member
        ((B,), (B,), Revoked),  # B was revoked
    ],
)
def test_non_members_and_revoked_are_refused(
    members: tuple[KeyPair, ...], revoked: tuple[KeyPair, ...], error: type[Exception]
) -> None:
    """The acceptor refuses a dialer that is not a live member."""
    acceptor_view = community(*members, revoked=revoked)
    dialer = Handshake(B, community(B), True, NOW)
    acceptor = Handshake(A, acceptor_view, False, NOW)
    with pytest.raises(error):
        acceptor.receive(decode_frame(dialer.start()), NOW)


def test_other_community_refused() -> None:
    """A member of another community cannot link."""
    other = Membership(C.node_id)
    other.add(other.sign(C, "community.created", C.node_id, now_ms=1))
    dialer = Handshake(C, other, True, NOW)
    with pytest.raises(Unauthorized):
        Handshake(A, community(), False, NOW).receive(decode_frame(dialer.start()), NOW)


def test_replayed_hello_cannot_finish_a_link() -> None:
    """A recorded H3 from an earlier handshake does not echo the new nonce."""
    view = community(B)
    first_dialer, first_acceptor = Handshake(A, view, True, NOW), Handshake(B, view, False, NOW)
    h1 = decode_frame(first_dialer.start())
    h3_old = decode_frame(
        first_dialer.receive(decode_frame(first_acceptor.receive(h1, NOW) or b""), NOW) or b""
    )
    second = Handshake(B, view, False, NOW)
    second.receive(h1, NOW)  # the attacker replays H1, then the old H3
    with pytest.raises(InvalidSignature):
        second.receive(h3_old, NOW)


def test_tampered_or_stale_hellos() -> None:
    """A changed field breaks the signature; an old timestamp is expired."""
    view = community(B)

    def change_name(step: int, frame: dict[str, object]) -> dict[str, object]:
        return {**frame, "name": "evil"} if step == 2 else frame

    with pytest.raises(InvalidSignature):
        run(Handshake(A, view, True, NOW), Handshake(B, view, False, NOW), change_name)
    with pytest.raises(Expired):
        Handshake(B, view, False, NOW + 120_000).receive(
            decode_frame(Handshake(A, view, True, NOW).start()), NOW + 120_000
        )


def test_expected_peer_enforced_and_self_links_refused() -> None:
    """Dialling a known NodeID and reaching another is refused; so is a link to ourselves."""
    view = community(B, C)
    dialer = Handshake(A, view, True, NOW, expect=C.node_id)
    acceptor = Handshake(B, view, False, NOW)
    with pytest.raises(Unauthorized):
        run(dialer, acceptor)
    with pytest.raises(LinkToSelf):
        Handshake(A, view, False, NOW).receive(
            decode_frame(Handshake(A, view, True, NOW).start()), NOW
        )


@pytest.mark.parametrize(
    ("members", "revoked", "error"),
    [
        ((), (), Unauthorized),  # B is not a member
        ((B,), (B,), Revoked),  # B was revoked
        ((A,), (), LinkToSelf),  # the dialer reached itself
    ],
)
def test_a_refused_dialer_gets_the_acceptors_error(
    members: tuple[KeyPair, ...], revoked: tuple[KeyPair, ...], error: type[WireError]
) -> None:
    """The acceptor's refusal goes back in a bye; the dialer raises the same typed error."""
    dialer_keys = B if error is not LinkToSelf else A
    dialer = Handshake(dialer_keys, community(dialer_keys), True, NOW)
    acceptor = Handshake(A, community(*members, revoked=revoked), False, NOW)
    with pytest.raises(WireError) as refusal:
        acceptor.receive(decode_frame(dialer.start()), NOW)
    with pytest.raises(WireError) as received:
        dialer.receive(decode_frame(bye_for(refusal.value)), NOW)
    assert (error, error, refusal.value.message, False, True) == (
        type(refusal.value),
        type(received.value),
        received.value.message,
        refusal.value.remote,
        received.value.remote,
    )


def test_a_bye_with_an_unknown_code_is_still_an_error() -> None:
    """A refusal code this version does not know becomes internal_error, naming the code."""
    error = refusal_from_bye({"t": "bye", "code": "newfangled", "reason": "why"})
    assert (InternalError, True) == (type(error), "newfangled" in error.message)


def test_frames_codec_and_limits() -> None:
    """CBOR frames round-trip; junk, unknown kinds and oversized frames are refused."""
    assert {"t": "ping", "seq": 3} == decode_frame(encode_frame("ping", seq=3))
    for bad in (b"\xff\xff", encode_frame("dance"), b"\x01"):
        with pytest.raises(BadRequest):
            decode_frame(bad)
    with pytest.raises(PayloadTooLarge):
        decode_frame(b"\x00" * (3 * 1024 * 1024))


def test_link_state_table_and_simultaneous_dials() -> None:
    """DOWN is final; the lower NodeID's outbound link wins a simultaneous dial."""
    assert (frozenset(), True, False) == (
        TRANSITIONS[LinkState.DOWN],
        winning_direction("ed25519:A", "ed25519:B"),
        winning_direction("ed25519:B", "ed25519:A"),
    )


def test_a_hello_with_an_unknown_field_is_refused_by_name() -> None:
    """A hello carrying a field its link's version does not list is bad_request naming
    it: ``relays`` before v4, any unlisted field on v4."""
    view = community(B)
    seen = []
    for link, extra in ((3, "relays"), (1, "relays"), (4, "relay_urls")):
        hello = {**decode_frame(Handshake(A, view, True, NOW, link=link).start()), extra: []}
        with pytest.raises(BadRequest) as refused:
            Handshake(B, view, False, NOW, link=link).receive(hello, NOW)
        seen.append(refused.value.message)
    expected = [f"unknown field '{f}' in hello frame" for f in ("relays", "relays", "relay_urls")]
    assert expected == seen


RELAYS = tuple(f"https://relay{i}.example:8443" for i in range(10))


def test_v4_hellos_list_the_senders_relays_and_older_links_none() -> None:
    """On a v4 link each side learns the other's relays from its hello (at most 8 sent);
    on v1-v3 links no hello carries the field and the peer lists none."""
    view = community(B)
    seen = []
    for link in (4, 3, 2, 1):
        dialer = Handshake(A, view, True, NOW, relays=RELAYS[:2], link=link)
        acceptor = Handshake(B, view, False, NOW, relays=RELAYS, link=link)
        carried: list[bool] = []

        def watch(step: int, frame: dict[str, object], carried: list[bool] = carried) -> object:
            carried.append("relays" in frame)
            return frame

        run(dialer, acceptor, watch)
        learnt = [p.relays if p else None for p in (acceptor.peer, dialer.peer)]
        seen.append((link, carried, *learnt))
    expected = [
        (4, [True, True, True], RELAYS[:2], RELAYS[:8]),
        *((link, [False] * 3, (), ()) for link in (3, 2, 1)),
    ]
    assert expected == seen


def test_hello_relays_are_signed() -> None:
    """A hello whose relays were changed in flight fails its signature."""

    def swap(step: int, frame: dict[str, object]) -> dict[str, object]:
        return {**frame, "relays": ["https://evil.example"]} if step == 2 else frame

    view = community(B)
    acceptor = Handshake(B, view, False, NOW, relays=RELAYS[:1])
    with pytest.raises(InvalidSignature):
        run(Handshake(A, view, True, NOW), acceptor, swap)


@pytest.mark.parametrize(
    "relays",
    [
        list(RELAYS[:9]),  # more than 8
        "https://relay0.example:8443",  # not a list
        [7],  # not strings
        [""],  # empty
        ["https://" + "r" * 600],  # too long
    ],
)
def test_v4_hello_relays_out_of_shape_are_refused(relays: object) -> None:
    """A v4 hello whose relays is not a list of at most 8 URLs of at most 512 characters
    is bad_request, before its signature is checked."""
    view = community(B)
    hello = {**decode_frame(Handshake(A, view, True, NOW).start()), "relays": relays}
    with pytest.raises(BadRequest) as refused:
        Handshake(B, view, False, NOW).receive(hello, NOW)
    expected = "hello relays is a list of at most 8 URLs of at most 512 characters"
    assert expected == refused.value.message
