"""Peer exchange (spec §7.1) on real nodes over loopback: a node learns the address of a
peer that linked to one of its neighbours after its own link came up."""

from __future__ import annotations

import dataclasses

from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import free_port, wait_until
from tests.mesh.rawpeer import raw_peer
from tests.mesh.test_relaying import UNDIALLABLE, one_community


async def test_a_node_that_only_dials_out_links_to_a_later_peer(make_config: MakeConfig) -> None:
    """A (undiallable, as behind NAT) links to B; C links to B later; A learns C, dials it."""
    configs = [make_config(mesh={"dial_interval_s": 0.1}) for _ in range(3)]
    one_community(configs)
    async with Node(configs[1]) as b:
        hidden = dataclasses.replace(
            configs[0].mesh, peers=(b.url,), advertise_url=UNDIALLABLE, direct_upgrade=False
        )
        async with Node(dataclasses.replace(configs[0], mesh=hidden)) as a:
            await wait_until(lambda: b.keys.node_id in a.mesh.links, 10, "a linked to b")
            late = dataclasses.replace(configs[2].mesh, peers=(b.url,))
            async with Node(dataclasses.replace(configs[2], mesh=late)) as c:
                await wait_until(lambda: c.keys.node_id in a.mesh.links, 10, "a linked to c")
                link = a.mesh.links[c.keys.node_id]
                outbound = link.outbound
    assert True is outbound


async def test_a_member_claiming_anothers_url_changes_nothing(make_config: MakeConfig) -> None:
    """M links to C claiming B's URL: C checks that URL, links to B there and shares it as
    B's only; B's check of C's URL leaves their link as it was."""
    configs = [make_config(mesh={"dial_interval_s": 0.1}) for _ in range(2)]
    one_community(configs)
    async with Node(configs[0]) as c, Node(configs[1]) as b, raw_peer(c, url=b.url) as m:
        await wait_until(lambda: b.keys.node_id in c.mesh.links, 10, "c linked to b")
        link = c.mesh.links[b.keys.node_id]
        await wait_until(lambda: b.mesh.book.verified_node(c.url) is not None, 10, "b checked")
        same_link = c.mesh.links.get(b.keys.node_id) is link
        claimed = [e for f in m.received("peers") for e in f["peers"] if e.get("url") == b.url]
        shared = c.mesh.book.urls_for_exchange()
        m_linked = m.node in c.mesh.links
    assert (True, True, c.keys.node_id) == (same_link, m_linked, b.mesh.book.verified_node(c.url))
    assert [{"url": b.url, "node": b.keys.node_id}] == [e for e in shared if e["url"] == b.url]
    assert [] == [e for e in claimed if e.get("node") == m.node]


async def test_a_node_behind_nat_learns_a_peer_whose_url_its_hub_has_not_checked_yet(
    make_config: MakeConfig,
) -> None:
    """C links to B; while B's check of C's URL is still under way A (undiallable) links
    to B: B's greeting tells A of C's claimed URL all the same, and A links to C."""
    configs = [make_config(mesh={"dial_interval_s": 0.1}) for _ in range(3)]
    one_community(configs)
    c_url = f"http://127.0.0.1:{free_port()}"
    async with Node(configs[1]) as b:
        b.mesh.dialer.probing.add(c_url)  # B's own dial of C's URL has not answered yet
        public = dataclasses.replace(configs[2].mesh, peers=(b.url,))
        c_node = dataclasses.replace(configs[2].node, port=int(c_url.rsplit(":", 1)[1]))
        async with Node(dataclasses.replace(configs[2], node=c_node, mesh=public)) as c:
            await wait_until(lambda: c.keys.node_id in b.mesh.links, 10, "c linked to b")
            hidden = dataclasses.replace(
                configs[0].mesh, peers=(b.url,), advertise_url=UNDIALLABLE, direct_upgrade=False
            )
            async with Node(dataclasses.replace(configs[0], mesh=hidden)) as a:
                await wait_until(lambda: c.keys.node_id in a.mesh.links, 10, "a linked to c")
                unchecked = b.mesh.book.verified_node(c_url)
                outbound = a.mesh.links[c.keys.node_id].outbound
    assert (None, True) == (unchecked, outbound)
