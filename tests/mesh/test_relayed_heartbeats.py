"""Heartbeat records of a relayed link (spec §7.5, §8) on real nodes over loopback: every
record of the link, its end included, names the relay it went through."""

from __future__ import annotations

import json
from pathlib import Path

from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.test_relaying import one_community, path_to, relayed_to


async def test_every_record_of_a_relayed_link_carries_its_path_and_relay(
    make_config: MakeConfig,
) -> None:
    """a's link_up, pongs and link_down for b all say ``path: relay`` via the relay."""
    configs = [make_config(mesh={"relay": True}), make_config(), make_config()]
    one_community(configs)
    async with Node(configs[0]) as relay, Node(relayed_to(configs[1], relay.url)) as a:
        async with Node(relayed_to(configs[2], relay.url)) as b:
            await wait_until(lambda: path_to(a, b) == "relayed", 15, "a relayed to b")
            peer = b.keys.node_id

            def ponged() -> bool:
                tracker = dict(a.mesh.health.heartbeats.items()).get(peer)
                return tracker is not None and tracker.rtt_p50_ms is not None

            await wait_until(
                ponged,
                15,
                "a pong from b",
            )
        await wait_until(lambda: path_to(a, b) is None, 15, "a's link to b down")
        a.mesh.health.hlog.flush()
        lines = [
            json.loads(line)
            for day in sorted((Path(configs[1].node.data_dir) / "heartbeats").glob("*.jsonl"))
            for line in day.read_text().splitlines()
        ]
    kinds = {(r["kind"], r["path"], r["via"]) for r in lines if r["peer"] == peer}
    via = relay.keys.node_id
    assert {("link_up", "relay", via), ("pong", "relay", via), ("link_down", "relay", via)} == {
        k for k in kinds if k[0] in ("link_up", "pong", "link_down")
    }
