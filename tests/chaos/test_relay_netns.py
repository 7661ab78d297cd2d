"""Steps shared by the relay scenarios (spec §8) in the NAT lab: keys and one membership
for the lab's machines, node processes in their namespaces, the linked paths and relay
counters of a node, subscribers. Two home nodes publishing and calling through one relay
is a scenario of the shared symmetric lab in test_relay_pair_netns.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from hearthnet.community import CommunityStore, Level
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Membership
from tests.chaos.mesh_lab import NamespacedClient
from tests.chaos.netns import HostProcess, Machine

FAST = {
    "HEARTHNET_MESH_ANTI_ENTROPY_S": "1",
    "HEARTHNET_MESH_CAPS_S": "1",
    "HEARTHNET_MESH_DIAL_INTERVAL_S": "0.2",
    "HEARTHNET_MESH_HEARTBEAT_S": "1",
    "HEARTHNET_MESH_PRESENCE_REFRESH_S": "1",
    "HEARTHNET_PUBSUB_SYNC": "normal",
}
PORT = "7080"


def prepare(root: Path, machines: list[Machine]) -> list[KeyPair]:
    """Keys in each machine's data dir and one membership log (the first founds it)."""
    keys = [load_or_create_keys(root / m.name) for m in machines]
    view = Membership(keys[0].node_id)
    view.add(view.sign(keys[0], "community.created", keys[0].node_id, now_ms=1, name="relay"))
    for i, k in enumerate(keys[1:]):
        view.add(view.sign(keys[0], "member.added", k.node_id, now_ms=2 + i, level=Level.MEMBER))
    for m in machines:
        CommunityStore(root / m.name).replace(list(view.records.values()))
    return keys


def start(root: Path, machine: Machine, *extra: str) -> HostProcess:
    """``hearthnet node start`` in the machine's namespace, returned once it is ready."""
    proc = machine.popen(
        *machine.python(
            "-m", "hearthnet.cli", "node", "start", "--name", machine.name,
            "--data-dir", str(root / machine.name), "--host", machine.ip, "--port", PORT,
            "--no-zeroconf", *extra,
        ),
        env=FAST,
    )  # fmt: skip
    proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), 30)
    return proc


def cli(root: Path, machine: Machine, *args: str) -> Any:
    """``hearthnet ARGS`` against the machine's node, inside its namespace; JSON out."""
    done = machine.run(
        *machine.python("-m", "hearthnet.cli", *args, "--data-dir", str(root / machine.name)),
        timeout=60,
    )
    return json.loads(done.stdout)


async def _peers(root: Path, machine: Machine) -> Any:
    async with NamespacedClient(root, machine, PORT) as client:
        return await client.request_json("GET", "/mesh/v1/peers")


def paths(root: Path, machine: Machine) -> dict[str, tuple[str, str | None]]:
    """``{peer: (path, via)}`` of the linked peers: what ``hearthnet peers --json`` shows
    (``GET /mesh/v1/peers`` signed with the node's key)."""
    peers = asyncio.run(_peers(root, machine))["peers"]
    return {p["node"]: (p["path"], p["via"]) for p in peers if p["linked"]}


def public_status(machine: Machine) -> Any:
    """The node's public ``/status`` (what ``hearthnet node status --json`` prints)."""
    done = machine.run("curl", "-s", f"http://{machine.ip}:{PORT}/status", timeout=30)
    return json.loads(done.stdout)


def relayed_in(root: Path, machine: Machine) -> float:
    """Route frames this member opened (``hearthnet_relayed_frames{direction="in"}``)."""
    done = machine.run("curl", "-s", f"http://{machine.ip}:{PORT}/metrics", timeout=30)
    for line in done.stdout.splitlines():
        if line.startswith('hearthnet_relayed_frames{direction="in"}'):
            return float(line.split()[-1])
    return 0.0


def subscribe(root: Path, machine: Machine, topic: str, count: int) -> HostProcess:
    """``hearthnet sub TOPIC --count COUNT`` in the machine's namespace."""
    return machine.popen(
        *machine.python(
            "-m", "hearthnet.cli", "sub", topic, "--last", str(count), "--count", str(count),
            "--data-dir", str(root / machine.name),
        ),
        env=FAST,
    )  # fmt: skip


async def both_paths(root: Path, a: Machine, b: Machine) -> list[dict[str, tuple[str, str | None]]]:
    """``{peer: (path, via)}`` on both home nodes, read at once."""
    return list(
        await asyncio.gather(asyncio.to_thread(paths, root, a), asyncio.to_thread(paths, root, b))
    )
