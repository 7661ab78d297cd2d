"""The mesh across network namespaces: zeroconf alone forms it; loss and partitions do
not lose messages (spec §7.1, §7.3). Real node processes, one per namespace."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.chaos.conftest import MakeLab
from tests.chaos.mesh_lab import prepare_community, start_nodes
from tests.chaos.netns import Host, Lab
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

FAST = {
    "HEARTHNET_MESH_ANTI_ENTROPY_S": "1",
    "HEARTHNET_MESH_CAPS_S": "2",
    "HEARTHNET_MESH_DIAL_INTERVAL_S": "0.2",
    "HEARTHNET_MESH_HEARTBEAT_S": "1",
    "HEARTHNET_PUBSUB_SYNC": "normal",
}


async def get(via: Host, url: str) -> Any:
    """GET JSON from inside ``via``'s namespace."""
    connector = aiohttp.TCPConnector(socket_factory=via.socket_factory)
    async with aiohttp.ClientSession(connector=connector) as http, http.get(url) as resp:
        return await resp.json()


async def linked(lab: Lab) -> list[int]:
    """Peer links per host."""
    return [(await get(h, f"http://{h.ip}:7080/status"))["peers_linked"] for h in lab.hosts]


async def test_nodes_find_each_other_by_zeroconf_alone_and_form_a_mesh(
    make_lab: MakeLab, tmp_path: Path
) -> None:
    """Four hosts on a bridge, nobody told of anybody: each ends up linked to the other three."""
    lab = make_lab(4)
    prepare_community(tmp_path, lab)
    start_nodes(tmp_path, lab, FAST)
    counts = await eventually(
        lambda: linked(lab),
        lambda c: c == [3, 3, 3, 3],
        within_s=30,
        what="a full mesh over zeroconf",
    )
    assert [3, 3, 3, 3] == counts


def cli(root: Path, host: Host, *args: str) -> Any:
    """Run ``hearthnet ARGS --data-dir <host's>`` inside the host's namespace; parse JSON out."""
    out = host.run(
        *host.python("-m", "hearthnet.cli", *args, "--data-dir", str(root / host.name)), timeout=60
    )
    return json.loads(out.stdout) if out.stdout.strip().startswith(("{", "[")) else out.stdout


async def held(root: Path, lab: Lab, topic: str) -> list[int]:
    """How many messages of ``topic`` each host's log holds."""
    counts = []
    for host in lab.hosts:
        topics = await asyncio.to_thread(cli, root, host, "topics", "--json", "--prefix", topic)
        counts.append(sum(t["messages"] for t in topics if t["topic"] == topic))
    return counts


async def test_partition_heals_and_every_node_converges(make_lab: MakeLab, tmp_path: Path) -> None:
    """Split 2|2 with 10 % loss on every link; publish on both sides; heal: all hold everything."""
    lab = make_lab(4)
    prepare_community(tmp_path, lab)
    start_nodes(tmp_path, lab, FAST)
    await eventually(
        lambda: linked(lab), lambda c: c == [3, 3, 3, 3], within_s=30, what="a full mesh"
    )
    a, b = lab.hosts[:2], lab.hosts[2:]
    lab.partition(a, b)
    lab.netem_all(loss_pct=10)
    for i in range(5):
        await asyncio.to_thread(cli, tmp_path, a[i % 2], "pub", "split", "--data", f'{{"i": {i}}}')
        await asyncio.to_thread(
            cli, tmp_path, b[i % 2], "pub", "split", "--data", f'{{"i": {100 + i}}}'
        )
    during = await held(tmp_path, lab, "split")
    lab.heal_all()
    after = await eventually(
        lambda: held(tmp_path, lab, "split"),
        lambda c: c == [10, 10, 10, 10],
        within_s=45,
        what="convergence after the partition healed",
    )
    assert ([5, 5, 5, 5], [10, 10, 10, 10]) == (during, after)
