"""Peer exchange (spec §7.1) on real nodes over loopback: a node learns the address of a
peer that linked to one of its neighbours after its own link came up."""

from __future__ import annotations

import dataclasses

from hearthnet.config import Config
from hearthnet.mesh.addresses import normalize_url
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import free_port, wait_until
from tests.mesh.rawpeer import raw_peer
from tests.mesh.test_relaying import UNDIALLABLE, one_community, path_to, relayed_to


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


async def test_a_relayed_peers_private_address_is_listed_in_its_own_row(
    make_config: MakeConfig,
) -> None:
    """A and B behind NATs of their own reach each other through relay R; the relay
    passes on the private address B's hello claims. A's peer list once showed it as a
    ``known`` row with no node beside B's relayed row; now one row per peer: the address
    is B's (its row while B is away), and still dialled expecting nobody."""
    configs = [make_config(mesh={"relay": True}), make_config(), make_config()]
    one_community(configs)
    homes = {"a": "http://127.0.0.2:9", "b": "http://127.0.0.3:9"}  # private, undiallable

    def home(config: Config, relay: str, url: str) -> Config:
        return dataclasses.replace(config, mesh=dataclasses.replace(
            relayed_to(config, relay).mesh, advertise_url=url, dial_interval_s=0.1
        ))  # fmt: skip

    async with Node(configs[0]) as relay, Node(home(configs[1], relay.url, homes["a"])) as a:
        async with Node(home(configs[2], relay.url, homes["b"])) as b:
            b_id = b.keys.node_id
            await wait_until(lambda: path_to(a, b) == "relayed", 20, "a relayed to b")
            await wait_until(
                lambda: normalize_url(homes["b"]) in a.mesh.book.addresses,
                10,
                "the relay passed b's address on",
            )
            linked = [(r["node"], r["linked"], r["url"]) for r in a.mesh.peers_status()]
            address = a.mesh.book.addresses[normalize_url(homes["b"])]
        await wait_until(lambda: b_id not in a.mesh.links, 15, "a saw b leave")
        away = [(r["node"], r["url"]) for r in a.mesh.peers_status() if r["node"] == b_id]
    relay_id = relay.keys.node_id
    assert (
        [(relay_id, True, relay.url), (b_id, True, None)],
        (None, None, b_id),
        [(b_id, normalize_url(homes["b"]))],
    ) == (
        sorted(linked, key=lambda r: r[0] != relay_id),
        (address.node, address.expect, address.claimed_by),
        away,
    )
