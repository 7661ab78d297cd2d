"""The direct upgrade (spec §8): two home nodes behind NAT, attached to one relay, punch
a direct TCP link (simultaneous open) where their NATs keep ports, and fall back to the
relay when that link dies. The plain-NAT scenarios share one lab and its nodes, started
once for the module (the first test sees the relayed path come up and the switch; the
second starts from the direct link it leaves). Where the NATs map every connection to a
new port the pair stays relayed: that scenario shares the symmetric lab of
test_relay_pair_netns.py. Real node processes, real nftables NAT."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.mesh_lab import NamespacedClient
from tests.chaos.nat_lab import NatLab
from tests.chaos.netns import HostProcess, Machine
from tests.chaos.relay_lab import RelayPair, start_all, stop_all
from tests.chaos.test_relay_netns import PORT, _peers, both_paths, prepare, subscribe
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

N = 20
PACE_S = 0.3  # between the publishes sent while the pair is still relayed


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
    """The ``n`` of every message the subscriber printed, once it printed ``count``."""

    def numbers() -> list[int]:
        return [
            json.loads(line)["data"]["n"]
            for line in sub.lines
            if line.startswith("{") and '"n"' in line
        ]

    # the predicate sees every line again on each wake, so it counts from scratch
    sub.wait_for_line(lambda _: len(numbers()) >= count, within_s)
    return numbers()


async def publish_numbers(
    root: Path, machine: Machine, topic: str, numbers: range, pause_s: float = 0.0
) -> None:
    """Publish ``{"n": n}`` for each number on the machine's node, each acknowledged
    before the next (what ``hearthnet pub`` does), ``pause_s`` apart."""
    async with NamespacedClient(root, machine, PORT) as client:
        for n in numbers:
            await client.publish(topic, "message", {"n": n})
            await asyncio.sleep(pause_s)


@pytest.fixture(scope="module")
def plain(nat_lab_support: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayPair]:
    """Relay and homes A and B behind plain NATs, all started (not yet linked)."""
    root = tmp_path_factory.mktemp("plain-pair")
    with NatLab(["plain", "plain"], public=("relay",)) as lab:
        relay = lab.public["relay"]
        home_a, home_b = lab.homes
        keys = prepare(root, [relay, home_a, home_b])
        homes = ("--relay-url", f"http://{relay.ip}:{PORT}")
        procs = start_all(root, [(relay, ("--relay",)), (home_a, homes), (home_b, homes)])
        try:
            yield RelayPair(lab, root, relay, home_a, home_b, keys)
        finally:
            stop_all(procs)


def both_direct(got: list[dict[str, tuple[str, str | None]]], pair: RelayPair) -> bool:
    """Home A's path to B and B's to A are both direct."""
    a_id, b_id = pair.keys[1].node_id, pair.keys[2].node_id
    return got[0].get(b_id, ("",))[0] == "direct" and got[1].get(a_id, ("",))[0] == "direct"


async def test_plain_nats_upgrade_to_direct_with_nothing_lost(plain: RelayPair) -> None:
    """Behind plain NATs the relayed pair goes direct; messages sent across arrive once each."""
    root, home_a, home_b = plain.root, plain.a, plain.b
    relay_keys, a_keys, b_keys = plain.keys
    sub = subscribe(root, home_b, "home.punch", N)
    try:
        # the first half published from the start, paced: across the relayed path coming
        # up and the switch; the second half once both sides are direct
        publishing = asyncio.create_task(
            publish_numbers(root, home_a, "home.punch", range(N // 2), PACE_S)
        )
        seen = await eventually(
            lambda: both_paths(root, home_a, home_b),
            lambda got: both_direct(got, plain),
            within_s=60,
            what="both home nodes direct to each other",
        )
        await publishing
        # hearthnet peers --json at A: B's row, the punched link's real address (B's
        # router's public one, plain NAT keeping the port) beside the LAN URL B claims
        row = next(p for p in (await _peers(root, home_a))["peers"] if p["node"] == b_keys.node_id)
        await publish_numbers(root, home_a, "home.punch", range(N // 2, N))
        got = await asyncio.to_thread(received, sub, N, 60)
        counts = await asyncio.to_thread(upgrades, home_a)
        await asyncio.sleep(3)  # frames still on the relayed path arrive, none refused
        refusals = [await asyncio.to_thread(refused, home) for home in (home_a, home_b)]
    finally:
        stop_all([sub])
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
    assert (f"{home_b.router.public_ip}:{PORT}", f"http://{home_b.ip}:{PORT}") == (
        row["remote"],
        row["url"],
    )


async def test_a_dead_direct_path_falls_back_to_the_relay(plain: RelayPair) -> None:
    """When the route between the two NATs is cut, the peers go back through the relay."""
    lab, root, home_a, home_b = plain.lab, plain.root, plain.a, plain.b
    relay_keys, a_keys, b_keys = plain.keys
    sub: HostProcess | None = None
    try:
        await eventually(
            lambda: both_paths(root, home_a, home_b),
            lambda got: both_direct(got, plain),
            within_s=60,
            what="both home nodes direct to each other",
        )
        lab.block(home_a.router, home_b.router)
        seen = await eventually(
            lambda: both_paths(root, home_a, home_b),
            lambda got: (
                got[0].get(b_keys.node_id, ("",))[0] in ("relayed", "upgrading")
                and got[1].get(a_keys.node_id, ("",))[0] in ("relayed", "upgrading")
            ),
            within_s=60,
            what="both home nodes back on the relay",
        )
        sub = subscribe(root, home_b, "home.fallback", 3)
        await publish_numbers(root, home_a, "home.fallback", range(3))
        got = await asyncio.to_thread(received, sub, 3, 60)
    finally:
        lab.unblock_all()
        if sub is not None:
            stop_all([sub])
    assert (relay_keys.node_id, relay_keys.node_id, [0, 1, 2]) == (
        seen[0][b_keys.node_id][1],
        seen[1][a_keys.node_id][1],
        sorted(got),
    )
