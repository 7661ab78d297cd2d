"""A member far over its relay budget (spec §8): its data is refused ``rate_limited``,
and its relayed link stays up, because heartbeats go outside the path sequence and the
relay charges them to their own allowance. Real nodes over loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import _node_caller, wait_until
from tests.mesh.test_relaying import one_community, path_to, relayed_to

HEARTBEAT_S = 0.5  # three missed pongs: the link is down after 1.5 s
LOAD_S = 4.0


async def test_a_member_over_its_budget_keeps_its_relayed_link(make_config: MakeConfig) -> None:
    """Publishing at ~30× an 8 KiB/s budget: refusals grow, the relayed link never drops."""
    configs = [
        make_config(mesh={"relay": True, "relay_member_bytes_per_s": 8192}),
        make_config(),
        make_config(),
    ]
    one_community(configs)
    async with Node(configs[0]) as relay:
        members = []
        for c in configs[1:]:
            config = relayed_to(c, relay.url)
            mesh = dataclasses.replace(config.mesh, heartbeat_s=HEARTBEAT_S)
            members.append(dataclasses.replace(config, mesh=mesh))
        async with Node(members[0]) as a, Node(members[1]) as b:
            await wait_until(
                lambda: (path_to(a, b), path_to(b, a)) == ("relayed", "relayed"),
                20,
                "a and b relayed to each other",
            )
            link = a.mesh.links[b.keys.node_id]
            me, pad = _node_caller(a), "x" * 1000
            start, i, drops = time.monotonic(), 0, []
            while time.monotonic() - start < LOAD_S:
                await asyncio.gather(
                    *(
                        a.pubsub.publish(me, "load", "m", {"i": i + k, "pad": pad})
                        for k in range(20)
                    )
                )
                i += 20
                await asyncio.sleep(0.1)
                if a.mesh.links.get(b.keys.node_id) is not link:
                    drops.append(link.down_reason)
                    break
            assert relay.mesh.relaying.relay is not None
            refused = relay.mesh.relaying.relay.statistics()["rate_limited"]
    assert ([], True) == (drops, refused > 100)
