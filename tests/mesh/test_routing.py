"""Routes: one link per peer, the simultaneous-dial rule, and the path a frame takes.
No sockets: links are never run, their queues are read directly."""

from __future__ import annotations

from hearthnet.mesh.actions import Forward
from hearthnet.mesh.frames import Ping
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.protocol import LinkState, PeerInfo
from hearthnet.mesh.routing import Routes
from tests.mesh.test_links import ResetSocket

LOW, HIGH = "ed25519:a", "ed25519:b"


def link_to(node: str, *, outbound: bool) -> PeerLink:
    """A link to ``node`` that is up and never run."""
    return PeerLink(
        PeerInfo(node, "", None, "0"),
        ResetSocket(),
        outbound=outbound,
        on_frame=lambda link, frame: None,
        on_down=lambda link, reason: None,
    )


async def test_simultaneous_dials_keep_the_lower_node_ids_outbound_link() -> None:
    """On the lower NodeID, an inbound link already up gives way to our outbound one; a
    later inbound one is refused."""
    routes = Routes(LOW)
    inbound = link_to(HIGH, outbound=False)
    outbound = link_to(HIGH, outbound=True)
    late = link_to(HIGH, outbound=False)
    taken = (routes.admit(inbound), routes.admit(outbound), routes.admit(late))
    assert ((True, True, False), outbound, LinkState.CLOSING) == (
        taken,
        routes.path_to(HIGH),
        inbound.state,
    )


async def test_a_frame_for_a_node_goes_on_its_path_and_forwards_skip_the_source() -> None:
    """send() queues on the node's path only; forward() queues on every link but skip;
    a node with no path gets nothing."""
    routes = Routes(LOW)
    b, c = link_to(HIGH, outbound=True), link_to("ed25519:c", outbound=True)
    routes.admit(b)
    routes.admit(c)
    sent = (routes.send(HIGH, Ping(1, 2)), routes.send("ed25519:z", Ping(1, 2)))
    routes.forward(Forward(b"x", skip=HIGH))
    assert ((True, False), 1, 1, "direct") == (sent, b.queued, c.queued, routes.path_kind(HIGH))


async def test_only_the_current_link_of_a_peer_is_removed() -> None:
    """A duplicate that lost reports down without removing the link that won."""
    routes = Routes(LOW)
    winner, loser = link_to(HIGH, outbound=True), link_to(HIGH, outbound=False)
    routes.admit(winner)
    routes.admit(loser)
    assert (False, winner, True, None) == (
        routes.remove(loser),
        routes.path_to(HIGH),
        routes.remove(winner),
        routes.path_to(HIGH),
    )
