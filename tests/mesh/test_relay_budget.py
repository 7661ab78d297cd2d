"""A member publishing far over its relay budget (spec §8): it paces itself to what the
relay grants, so the relay refuses next to nothing; gossip past the queue bound is shed and
anti-entropy brings it later; the relayed link stays up and every acknowledged publish
reaches the other member once. Real nodes over loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import _node_caller, wait_until
from tests.mesh.test_relaying import one_community, path_to, relayed_to

BUDGET = 32 * 1024  # bytes/s the relay grants each member
PAD = 1000  # bytes of padding per message: ~1.4 KiB each on the wire
BATCH, BATCHES = 25, 10  # 25 messages every 0.1 s for 1 s: ~10 times the budget


async def test_a_member_far_over_its_budget_paces_itself_and_loses_nothing(
    make_config: MakeConfig,
) -> None:
    """~10× a 32 KiB/s budget for 1 s: the link stays, the relay refuses (almost) nothing,
    gossip is shed and repaired, and b holds every message a published, once."""
    configs = [
        make_config(mesh={"relay": True, "relay_member_bytes_per_s": BUDGET}),
        make_config(),
        make_config(),
    ]
    one_community(configs)
    async with Node(configs[0]) as relay:
        members = []
        for c in configs[1:]:
            config = relayed_to(c, relay.url)
            mesh = dataclasses.replace(
                config.mesh, heartbeat_s=0.5, anti_entropy_s=1.0, relay_pace_queue_bytes=48_000
            )
            members.append(dataclasses.replace(config, mesh=mesh))
        async with Node(members[0]) as a, Node(members[1]) as b:
            await wait_until(
                lambda: (path_to(a, b), path_to(b, a)) == ("relayed", "relayed"),
                20,
                "a and b relayed to each other",
            )
            link = a.mesh.links[b.keys.node_id]
            me, pad = _node_caller(a), "x" * PAD
            for n in range(BATCHES):
                await asyncio.gather(
                    *(
                        a.pubsub.publish(me, "load", "m", {"i": n * BATCH + k, "pad": pad})
                        for k in range(BATCH)
                    )
                )
                await asyncio.sleep(0.1)
            total = BATCH * BATCHES
            links = []

            def caught_up() -> bool:
                links.append(a.mesh.links.get(b.keys.node_id) is link)
                return b.mesh.tracker.heads.get(a.keys.node_id, 0) >= total

            await wait_until(caught_up, 40, "b holds every message of a")
            rows = await b.message_log.reader.read_origin(a.keys.node_id, 1, total, total + 10)
            got = sorted(json.loads(r)["data"]["i"] for r in rows)
            assert relay.mesh.relaying.relay is not None
            refused = relay.mesh.relaying.relay.statistics()["rate_limited"]
            metrics = dict(
                line.rsplit(" ", 1) for line in a.metrics.render().splitlines() if line[:1] != "#"
            )
    assert (list(range(total)), True, True, True) == (
        got,
        all(links),
        refused <= 5,  # spec §8: pacing keeps refusals near zero
        float(metrics["hearthnet_relayed_shed_frames"]) > 0
        and float(metrics["hearthnet_relayed_paced_bytes"]) > 0,
    )
