"""Two home nodes behind NAT reach each other through one relay (spec §8). Real node
processes: the relay on a public host, each home node behind its own NAT router that
drops unsolicited inbound, so neither home node can dial the other. The NATs are
symmetric (fully-random), so the direct upgrade fails and the pair stays relayed (the
upgrade itself: test_punch_netns.py)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from hearthnet.community import CommunityStore, Level
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Membership
from tests.chaos.conftest import MakeNatLab
from tests.chaos.netns import HostProcess, Machine
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

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


def paths(root: Path, machine: Machine) -> dict[str, tuple[str, str | None]]:
    """``{peer: (path, via)}`` of the linked peers, from ``hearthnet peers --json``."""
    peers = cli(root, machine, "peers", "--json")["peers"]
    return {p["node"]: (p["path"], p["via"]) for p in peers if p["linked"]}


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


async def test_two_nat_nodes_publish_and_call_through_one_relay(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """Two NAT'd nodes see each other relayed; a publish and a pinned call get across."""
    lab = make_nat_lab(["fully-random", "fully-random"], public=("relay",))
    relay = lab.public["relay"]
    home_a, home_b = lab.homes
    relay_keys, a_keys, b_keys = prepare(tmp_path, [relay, home_a, home_b])
    relay_url = f"http://{relay.ip}:{PORT}"
    procs = [start(tmp_path, relay, "--relay")]
    try:
        for home in (home_a, home_b):
            procs.append(start(tmp_path, home, "--relay-url", relay_url))
        want = (
            {relay_keys.node_id: ("direct", None), b_keys.node_id: ("relayed", relay_keys.node_id)},
            {relay_keys.node_id: ("direct", None), a_keys.node_id: ("relayed", relay_keys.node_id)},
        )
        seen = await eventually(
            lambda: both_paths(tmp_path, home_a, home_b),
            lambda got: tuple(got) == want,
            within_s=60,
            what="each home node relayed to the other via the relay",
        )
        sub = subscribe(tmp_path, home_b, "home.news", 1)
        procs.append(sub)
        published = await asyncio.to_thread(
            cli, tmp_path, home_a, "pub", "home.news", "--json", "--data", '{"n": 42}'
        )
        line = await asyncio.to_thread(sub.wait_for_line, lambda ln: '"n": 42' in ln, 30)
        answer = await asyncio.to_thread(
            cli, tmp_path, home_a, "call", "echo", "--body", '{"x": 7}', "--target", b_keys.node_id
        )
        opened = await asyncio.to_thread(relayed_in, tmp_path, home_b)
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)
    got = json.loads(line)
    assert (want, (published["id"], {"n": 42}), {"echo": {"x": 7}}, True) == (
        tuple(seen),
        (got["id"], got["data"]),
        answer,
        opened > 0,
    )
