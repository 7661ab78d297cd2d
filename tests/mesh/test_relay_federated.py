"""Nodes of federated communities on peer links and relays (spec §8): the handshake takes
them only with an agreement in force and a relay at one end, the relay routes them to and
from our members only, and their links carry relay frames and the bridge's requests,
nothing of the mesh. Pure: no sockets."""

from __future__ import annotations

import pytest

from hearthnet.errors import Forbidden, Unauthorized, WireError
from hearthnet.federation.carrier import FedRequest, check_request
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.links import LinkErrors, PeerLink
from hearthnet.mesh.protocol import Handshake, PeerInfo, decode_frame, encode_frame
from hearthnet.mesh.relay_core import Refuse, RelayCore, RelayStats, Send
from hearthnet.mesh.relay_federated import FederatedLinks
from hearthnet.mesh.relay_frames import Attach, Route, RouteError
from hearthnet.mesh.relayed_link import RelayedLink
from hearthnet.metrics import MetricsRegistry

A = KeyPair.from_seed(b"\x61" * 32)  # founds community A; the relay
A2 = KeyPair.from_seed(b"\x62" * 32)  # a member of A (the bridge of A)
B = KeyPair.from_seed(b"\x71" * 32)  # founds community B (its bridge)
C = KeyPair.from_seed(b"\x81" * 32)  # founds community C: no agreement with A
NOW = 1_763_800_000_000
ADDR = "198.51.100.9:50000"


def view_of(founder: KeyPair, *members: KeyPair) -> Membership:
    """A community founded by ``founder`` with ``members``."""
    view = Membership(founder.node_id)
    view.add(view.sign(founder, "community.created", founder.node_id, now_ms=1))
    for i, m in enumerate(members):
        view.add(view.sign(founder, "member.added", m.node_id, now_ms=2 + i))
    return view


def in_force(
    *nodes: KeyPair,
    community: str,
    bridges: tuple[KeyPair, ...] | None = None,
    metrics: MetricsRegistry | None = None,
) -> FederatedLinks:
    """Federated links where ``nodes`` are members of ``community`` under an agreement
    that names ``bridges`` (all of them unless given) its bridges."""
    links = FederatedLinks(metrics)
    ids = {k.node_id for k in nodes}
    named = ids if bridges is None else {k.node_id for k in bridges}
    links.community_of = lambda node: community if node in ids else None
    links.bridge_of = lambda node: community if node in named else None
    return links


def shake(dialer: Handshake, acceptor: Handshake) -> None:
    """The three hellos."""
    h2 = acceptor.receive(decode_frame(dialer.start()), NOW)
    assert h2 is not None
    h3 = dialer.receive(decode_frame(h2), NOW)
    assert h3 is not None
    assert acceptor.receive(decode_frame(h3), NOW) is None


def test_a_federated_bridge_attaches_to_a_relay_of_the_other_community() -> None:
    """B's bridge dials A's relay: both take the other as a node of a federated community."""
    a_side = in_force(B, community=B.node_id)
    b_side = in_force(A, community=A.node_id)
    dialer = Handshake(B, view_of(B), True, NOW, federated=b_side.allows, bridge=b_side.admits)
    relay = Handshake(
        A, view_of(A), False, NOW, relay=True, federated=a_side.allows, bridge=a_side.admits
    )
    shake(dialer, relay)
    assert (B.node_id, A.node_id, True) == (
        relay.peer.community if relay.peer else None,
        dialer.peer.community if dialer.peer else None,
        dialer.peer.relay if dialer.peer else None,
    )


def test_a_member_not_named_a_bridge_is_refused_by_the_relay_and_counted() -> None:
    """B2 is a member of B under the agreement, but the agreement names only B as B's
    bridge: A's relay refuses B2's hello as forbidden and counts not_a_bridge."""
    b2 = KeyPair.from_seed(b"\x72" * 32)
    metrics = MetricsRegistry()
    a_side = in_force(B, b2, community=B.node_id, bridges=(B,), metrics=metrics)
    relay = Handshake(
        A, view_of(A), False, NOW, relay=True, federated=a_side.allows, bridge=a_side.admits
    )
    dialer = Handshake(b2, view_of(B, b2), True, NOW)
    with pytest.raises(Forbidden, match="not named among the bridges") as refused:
        shake(dialer, relay)
    assert ("forbidden", {"not_a_bridge": 1}, True) == (
        refused.value.code,
        a_side.refused,
        'hearthnet_federated_refused{reason="not_a_bridge"} 1' in metrics.render(),
    )


def test_only_named_bridges_get_a_relayed_session_or_the_relays_service() -> None:
    """A relayed link with a member not named a bridge is refused (not_a_bridge); a relay
    of theirs we dialled needs membership only; the named bridge is served."""
    b2 = KeyPair.from_seed(b"\x72" * 32)
    links = in_force(B, b2, community=B.node_id, bridges=(B,))
    session, _ = relayed(links, b2, B.node_id)
    their_relay = PeerLink(
        PeerInfo(b2.node_id, "", None, "", relay=True, community=B.node_id),
        None,  # type: ignore[arg-type]  # never written to here
        outbound=True,
        on_frame=links.frame,
        on_down=lambda _l, _r: None,
        errors=LinkErrors.register(MetricsRegistry()),
    )
    assert (False, True, (True, False), {"not_a_bridge": 1}) == (
        links.up(session),
        links.up(their_relay),
        (links.serves(B.node_id), links.serves(b2.node_id)),
        links.refused,
    )


def test_another_community_without_an_agreement_is_refused_as_before() -> None:
    """C has no agreement with A: A's relay refuses its hello, as a stranger's."""
    relay = Handshake(
        A, view_of(A), False, NOW, relay=True, federated=in_force(B, community=B.node_id).allows
    )
    dialer = Handshake(C, view_of(C), True, NOW)
    with pytest.raises(Unauthorized, match="another community"):
        relay.receive(decode_frame(dialer.start()), NOW)


def test_a_federated_node_claiming_to_relay_gets_no_link_with_a_plain_member() -> None:
    """B's bridge says relay in its hello and dials A's plain member: refused; only our
    own dial of a relay of theirs, or their dial of our relay, opens a federated link."""
    plain = Handshake(
        A2, view_of(A, A2), False, NOW, federated=in_force(B, community=B.node_id).allows
    )
    dialer = Handshake(B, view_of(B), True, NOW, relay=True)
    with pytest.raises(Unauthorized, match="another community"):
        plain.receive(decode_frame(dialer.start()), NOW)


def test_the_carrier_keeps_only_the_credential_headers() -> None:
    """A carried request loses every header but the credentials and the call's."""
    sent = {"X-HearthNet-Community": "B", "Host": "evil", "Transfer-Encoding": "chunked"}
    kept = check_request(FedRequest(1, "post", "/bus/v1/call", sent, None), "B")
    assert ("POST", {"X-HearthNet-Community": "B"}) == (kept.method, kept.headers)


def test_a_federated_node_gets_no_link_where_neither_end_relays() -> None:
    """An agreement alone opens no peer link: one end must be a relay."""
    plain = Handshake(
        A2, view_of(A, A2), False, NOW, federated=in_force(B, community=B.node_id).allows
    )
    dialer = Handshake(B, view_of(B), True, NOW)
    with pytest.raises(Unauthorized, match="another community"):
        plain.receive(decode_frame(dialer.start()), NOW)


def test_the_relay_routes_a_federated_node_only_to_and_from_its_own_members() -> None:
    """B to A's member is forwarded; B to C (both foreign) is unreachable and counted;
    C cannot attach."""
    own = {A.node_id, A2.node_id}
    served = own | {B.node_id, "ed25519:" + "Z" * 52}
    core = RelayCore(A.node_id, served.__contains__, is_own=own.__contains__)
    other = "ed25519:" + "Z" * 52  # a second federated node
    for node in (A2.node_id, B.node_id, other):
        core.link_up(node, node, ADDR, 0.0)
        core.receive(node, Attach(), 0.0)
    core.link_up("c", C.node_id, ADDR, 0.0)
    to_member = core.receive(B.node_id, Route(A2.node_id, B.node_id, 4, 1, b"x"), 1.0)
    from_member = core.receive(A2.node_id, Route(B.node_id, A2.node_id, 4, 2, b"x"), 1.0)
    transit = core.receive(B.node_id, Route(other, B.node_id, 4, 3, b"x"), 1.0)
    stats: RelayStats = core.statistics()
    assert (
        [A2.node_id],
        [B.node_id],
        [Send(B.node_id, RouteError(other, B.node_id, 3, "unreachable"))],
        1,
        [Refuse("c", "unauthorized")],
    ) == (
        [a.link for a in to_member],
        [a.link for a in from_member],
        transit,
        stats.foreign_routes,
        core.receive("c", Attach(), 1.0),
    )


def relayed(
    links: FederatedLinks, node: KeyPair, community: str
) -> tuple[RelayedLink, list[bytes]]:
    """A relayed link with ``node`` of ``community`` whose frames are collected."""
    sent: list[bytes] = []

    def collect(_peer: str, data: bytes) -> bool:
        sent.append(data)
        return True

    link = RelayedLink(
        PeerInfo(node.node_id, "", None, "", community=community),
        A.node_id,
        outbound=True,
        transmit=collect,
        on_frame=links.frame,
        on_down=lambda _l, _r: None,
        errors=LinkErrors.register(MetricsRegistry()),
    )
    return link, sent


def test_a_federated_link_carries_no_frame_of_the_mesh() -> None:
    """Gossip, calls and presence off a federated link are dropped and counted; a ping
    is answered; the bridge's requests go to the carrier."""
    links = in_force(B, community=B.node_id)
    carried: list[str] = []
    links.carry = lambda _link, frame: carried.append(frame["t"])
    link, sent = relayed(links, B, B.node_id)
    assert links.up(link)
    for kind in ("msg", "ihave", "call", "presence", "membership", "caps"):
        link.on_frame(link, {"t": kind})
    link.on_frame(link, {"t": "fed_req"})
    link.on_frame(link, decode_frame(encode_frame("ping", seq=7, ts=NOW)))
    assert (
        {f"frame_{k}": 1 for k in ("msg", "ihave", "call", "presence", "membership", "caps")},
        ["fed_req"],
        ["pong"],
    ) == (links.refused, carried, [decode_frame(s)["t"] for s in sent])


def test_a_revoked_agreement_ends_the_federated_link() -> None:
    """Once the agreement is not in force, the link is named for closing and gets one
    farewell (which hands over the revocation, then closes it)."""
    links = in_force(B, community=B.node_id)
    farewells: list[PeerLink] = []
    links.farewell = farewells.append
    link, _ = relayed(links, B, B.node_id)
    links.up(link)
    before = links.ended()
    links.community_of = links.bridge_of = lambda node: None  # revoked, or expired
    for ended in links.ended() * 2:  # two ticks before the farewell closed it
        links.end(ended)
    assert ([], [link], [link], {"agreement_ended": 1}) == (
        before,
        links.ended(),
        farewells,
        links.refused,
    )


def test_a_link_is_refused_once_the_agreement_is_gone() -> None:
    """up() of a node whose community has no agreement in force is refused and counted."""
    links = in_force(community=B.node_id)
    link, _ = relayed(links, B, B.node_id)
    assert (False, {"no_agreement": 1}) == (links.up(link), links.refused)


@pytest.mark.parametrize(
    ("method", "path", "community", "code"),
    [
        ("POST", "/mesh/v1/federation/sync", "B", None),
        ("GET", "/pubsub/v1/subscribe?topics=chat.**&since_seq=0", "B", None),
        ("POST", "/bus/v1/call", "B", None),
        ("POST", "/pubsub/v1/publish", "B", "forbidden"),
        ("GET", "/mesh/v1/peers", "B", "forbidden"),
        ("POST", "/mesh/v1/federation", "B", "forbidden"),
        ("POST", "/bus/v1/call", "A", "forbidden"),  # signed as one of ours: not carried
    ],
)
def test_only_a_bridges_requests_for_its_own_community_are_carried(
    method: str, path: str, community: str, code: str | None
) -> None:
    """The carrier takes sync, push, pull and calls signed for the link peer's community."""
    request = FedRequest(1, method, path, {"X-HearthNet-Community": community}, None)
    got: str | None = None
    try:
        check_request(request, "B")
    except WireError as exc:
        got = exc.code
    assert code == got


def test_federated_links_are_peers_rows_with_community_bridge_and_relay() -> None:
    """``hearthnet peers`` rows of federated links: the relayed bridge with its relay
    and community, flagged a bridge."""
    links = in_force(B, community=B.node_id)
    link, _ = relayed(links, B, B.node_id)
    links.up(link)
    row = links.rows()[0]
    assert (B.node_id, "relayed", A.node_id, B.node_id, True, False, None) == (
        row["node"],
        row["path"],
        row["via"],
        row["community"],
        row["bridge"],
        row["relay"],
        row["rtt_ms_p50"],
    )
