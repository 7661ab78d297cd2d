"""The direct upgrade (spec §8): two home nodes behind NAT, attached to one relay, punch
a direct TCP link (simultaneous open) where their NATs keep ports, and stay relayed where
the NATs map every connection to a new port. Real node processes, real nftables NAT."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from tests.chaos.conftest import MakeNatLab
from tests.chaos.netns import HostProcess, Machine
from tests.chaos.test_relay_netns import PORT, both_paths, cli, prepare, start, subscribe
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

N = 20


def upgrades(machine: Machine) -> dict[str, float]:
    """``hearthnet_path_upgrades`` by outcome, from the node's ``/metrics``."""
    done = machine.run("curl", "-s", f"http://{machine.ip}:{PORT}/metrics", timeout=30)
    out: dict[str, float] = {}
    for line in done.stdout.splitlines():
        if line.startswith("hearthnet_path_upgrades{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = float(line.split()[-1])
    return out


def refused(machine: Machine) -> float:
    """Relayed frames refused end to end (``hearthnet_relayed_refused_frames``, all codes)."""
    done = machine.run("curl", "-s", f"http://{machine.ip}:{PORT}/metrics", timeout=30)
    return sum(
        float(line.split()[-1])
        for line in done.stdout.splitlines()
        if line.startswith("hearthnet_relayed_refused_frames{")
    )


def received(sub: HostProcess, count: int, within_s: float) -> list[int]:
    """The ``n`` of the first ``count`` messages the subscriber printed."""
    got: list[int] = []

    def one(line: str) -> bool:
        if line.startswith("{") and '"n"' in line:
            got.append(json.loads(line)["data"]["n"])
        return len(got) >= count

    sub.wait_for_line(one, within_s)
    return got


async def test_plain_nats_upgrade_to_direct_with_nothing_lost(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """Behind plain NATs the relayed pair goes direct; messages sent across arrive once each."""
    lab = make_nat_lab(["plain", "plain"], public=("relay",))
    relay = lab.public["relay"]
    home_a, home_b = lab.homes
    relay_keys, a_keys, b_keys = prepare(tmp_path, [relay, home_a, home_b])
    procs = [start(tmp_path, relay, "--relay")]
    try:
        for home in (home_a, home_b):
            procs.append(start(tmp_path, home, "--relay-url", f"http://{relay.ip}:{PORT}"))
        sub = subscribe(tmp_path, home_b, "home.punch", N)
        procs.append(sub)

        def publish() -> None:
            for n in range(N):
                cli(tmp_path, home_a, "pub", "home.punch", "--json", "--data", json.dumps({"n": n}))

        # published from the start: across the relayed path coming up and the switch
        publishing = asyncio.create_task(asyncio.to_thread(publish))
        seen = await eventually(
            lambda: both_paths(tmp_path, home_a, home_b),
            lambda got: (
                got[0].get(b_keys.node_id, ("",))[0] == "direct"
                and got[1].get(a_keys.node_id, ("",))[0] == "direct"
            ),
            within_s=60,
            what="both home nodes direct to each other",
        )
        await publishing
        got = await asyncio.to_thread(received, sub, N, 60)
        counts = await asyncio.to_thread(upgrades, home_a)
        await asyncio.sleep(3)  # frames still on the relayed path arrive, none refused
        refusals = [await asyncio.to_thread(refused, home) for home in (home_a, home_b)]
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)
    assert (
        ("direct", None),
        ("direct", None),
        list(range(N)),
        True,
        [0.0, 0.0],
    ) == (
        seen[0][b_keys.node_id],
        seen[1][a_keys.node_id],
        sorted(got),
        counts.get("succeeded", 0) >= 1,
        refusals,
    )
    assert relay_keys.node_id in seen[0]


async def test_symmetric_nats_stay_relayed_and_traffic_flows(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """Behind fully-random NATs the punch fails, the link stays relayed and messages arrive."""
    lab = make_nat_lab(["fully-random", "fully-random"], public=("relay",))
    relay = lab.public["relay"]
    home_a, home_b = lab.homes
    relay_keys, a_keys, b_keys = prepare(tmp_path, [relay, home_a, home_b])
    procs = [start(tmp_path, relay, "--relay")]
    try:
        for home in (home_a, home_b):
            procs.append(start(tmp_path, home, "--relay-url", f"http://{relay.ip}:{PORT}"))
        failed = await eventually(
            lambda: asyncio.gather(
                asyncio.to_thread(upgrades, home_a), asyncio.to_thread(upgrades, home_b)
            ),
            lambda got: all(side.get("failed", 0) >= 1 for side in got),
            within_s=90,
            what="a punch tried and failed on both sides",
        )
        seen = await both_paths(tmp_path, home_a, home_b)
        sub = subscribe(tmp_path, home_b, "home.punch", 3)
        procs.append(sub)
        for n in range(3):
            await asyncio.to_thread(
                cli, tmp_path, home_a, "pub", "home.punch", "--json", "--data", json.dumps({"n": n})
            )
        got = await asyncio.to_thread(received, sub, 3, 60)
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)
    assert (
        ("relayed", relay_keys.node_id),
        ("relayed", relay_keys.node_id),
        [0, 1, 2],
        0.0,
    ) == (
        seen[0][b_keys.node_id],
        seen[1][a_keys.node_id],
        sorted(got),
        failed[0].get("succeeded", 0.0) + failed[1].get("succeeded", 0.0),
    )


async def test_a_dead_direct_path_falls_back_to_the_relay(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """When the route between the two NATs is cut, the peers go back through the relay."""
    lab = make_nat_lab(["plain", "plain"], public=("relay",))
    relay = lab.public["relay"]
    home_a, home_b = lab.homes
    relay_keys, a_keys, b_keys = prepare(tmp_path, [relay, home_a, home_b])
    procs = [start(tmp_path, relay, "--relay")]
    try:
        for home in (home_a, home_b):
            procs.append(start(tmp_path, home, "--relay-url", f"http://{relay.ip}:{PORT}"))
        await eventually(
            lambda: both_paths(tmp_path, home_a, home_b),
            lambda got: (
                got[0].get(b_keys.node_id, ("",))[0] == "direct"
                and got[1].get(a_keys.node_id, ("",))[0] == "direct"
            ),
            within_s=60,
            what="both home nodes direct to each other",
        )
        lab.block(home_a.router, home_b.router)
        seen = await eventually(
            lambda: both_paths(tmp_path, home_a, home_b),
            lambda got: (
                got[0].get(b_keys.node_id, ("",))[0] in ("relayed", "upgrading")
                and got[1].get(a_keys.node_id, ("",))[0] in ("relayed", "upgrading")
            ),
            within_s=60,
            what="both home nodes back on the relay",
        )
        sub = subscribe(tmp_path, home_b, "home.punch", 3)
        procs.append(sub)
        for n in range(3):
            await asyncio.to_thread(
                cli, tmp_path, home_a, "pub", "home.punch", "--json", "--data", json.dumps({"n": n})
            )
        got = await asyncio.to_thread(received, sub, 3, 60)
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)
    assert (relay_keys.node_id, relay_keys.node_id, [0, 1, 2]) == (
        seen[0][b_keys.node_id][1],
        seen[1][a_keys.node_id][1],
        sorted(got),
    )
