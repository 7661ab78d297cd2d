"""A frame sent to a peer while its direct link is closing (spec §8: a direct link that
dies "without losing or duplicating a frame"): the link refuses it and keeps it, and
the link's end hands it on (mesh/unsent.py): to the relayed link of a fall-back, or into
the held sequence for a re-dial. It matters where the dying link was the only way to
the peer: with a relay that is a member, a flooded frame (presence, membership, gossip)
reaches the peer through the relay's own links anyway. So here no relay is left: a and
b direct, the relay stopped. Real nodes over loopback, in-process."""

from __future__ import annotations

from hearthnet.clock import now_ms
from hearthnet.mesh.addresses import normalize_url
from hearthnet.mesh.protocol import LinkState
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.test_path_hold_links import without_relay
from tests.mesh.test_relaying import path_to

TOPIC = "room.unsent"


async def test_presence_sent_while_the_direct_link_closes_reaches_the_peer_after_a_redial(
    make_config: MakeConfig,
) -> None:
    """a's direct link to b, settled (plain frames), starts closing with no bye, and in
    the same step a floods a presence ``leave`` then ``join`` of a member of its own:
    the link refuses both and keeps them; both ends hold the sequence (no relay), a
    hands them into it, re-dials, and b has the member (the join, after the leave).
    (Before, they were lost with the link: the member, announced by no refresh, never
    reached b.)"""
    async with without_relay(make_config, direct=True) as (a, b):
        link = a.mesh.links[b.keys.node_id]
        await wait_until(lambda: link.sequencer is None, 20, "a's direct link plain")
        a.mesh.book.addresses.pop(normalize_url(b.url), None)  # a re-dials when told
        ms = now_ms()
        member = {
            "client_id": "c-unsent",
            "identity": "",
            "node": a.keys.node_id,
            "joined_ms": ms,
            "last_seen_ms": ms,
            "name": "late",
        }
        link.close("closing for the test", send_bye=False)
        for kind in ("leave", "join"):
            a.mesh.traffic.local_presence([{"topic": TOPIC, "kind": kind, "member": member}])
        refused = (link.state, link.queued, link.sequencer is None)
        await wait_until(
            lambda: (path_to(a, b), path_to(b, a)) == (None, None), 10, "the link down"
        )
        a.mesh.spawn(a.mesh.dial(b.url), "redial-b")
        await wait_until(
            lambda: "c-unsent" in b.pubsub.presence.topics.get(TOPIC, {}),
            10,
            "b has the member a announced while its link closed",
        )
        switches = (a.mesh.relaying.switch, b.mesh.relaying.switch)
        held = tuple(s.held.held if s is not None else None for s in switches)
    assert ((LinkState.CLOSING, 0, True), (1, 1)) == (refused, held)
