"""Peer exchange (spec §7.1) on real nodes over loopback: a node learns the address of a
peer that linked to one of its neighbours after its own link came up."""

from __future__ import annotations

import dataclasses

from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
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
