"""A partition of a half-NAT'd mesh (spec §6, §8): six node processes, three on public
addresses (two of them federated relays) and three home nodes behind symmetric NATs,
each attached to both relays. The internet is cut into two halves, each with one relay;
every node publishes on its side; the cut heals; every node ends with every message,
once. Real nftables NAT; the homes reach anything only through a relay or by dialling
out."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.conftest import MakeNatLab
from tests.chaos.netns import HostProcess, Machine
from tests.chaos.relay_lab import probe, start_all, stop_all, url
from tests.chaos.test_relay_netns import paths, prepare
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

PER_NODE = 3
NODES = 6
ALL = PER_NODE * NODES


def received(sub: HostProcess) -> list[tuple[str, int, str]]:
    """``(origin, origin_seq, id)`` of the messages a subscriber printed so far."""
    return [(m["origin"], m["origin_seq"], m["id"]) for m in sub.json_lines() if "id" in m]


def subscribe(root: Path, machine: Machine) -> HostProcess:
    """``hearthnet sub part.* --full``, exiting after every message of the scenario."""
    return machine.popen(
        *machine.python(
            "-m", "hearthnet.cli", "sub", "part.*", "--full",
            "--last", str(ALL), "--count", str(ALL), "--data-dir", str(root / machine.name),
        ),
    )  # fmt: skip


async def test_a_half_natted_mesh_converges_after_a_partition(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """Both halves publish while cut apart; after healing all six nodes hold all 18, once."""
    lab = make_nat_lab(["fully-random"] * 3, public=("relay", "relay2", "pub"))
    relay1, relay2, pub = (lab.public[n] for n in ("relay", "relay2", "pub"))
    h0, h1, h2 = lab.homes
    machines: list[Machine] = [relay1, pub, h0, relay2, h1, h2]  # side X, then side Y
    keys = prepare(tmp_path, machines)
    ids = [k.node_id for k in keys]
    both = ("--relay-url", url(relay1), "--relay-url", url(relay2))
    procs = start_all(
        tmp_path,
        [
            (relay2, ("--relay", "--relay-peer", url(relay1))),  # federated: each names the other
            (relay1, ("--relay", "--relay-peer", url(relay2))),
            (pub, ("--peer", url(relay1), "--peer", url(relay2))),
            (h0, both),
            (h1, both),
            (h2, both),
        ],
    )
    try:
        await eventually(
            lambda: asyncio.gather(*(asyncio.to_thread(paths, tmp_path, m) for m in machines)),
            lambda got: all(
                set(ids) - {me} <= set(seen) for me, seen in zip(ids, got, strict=True)
            ),
            within_s=90,
            what="every node linked to the five others, directly or relayed",
        )
        subs = [subscribe(tmp_path, m) for m in machines]
        procs += subs
        lab.partition([relay1, pub, h0.router], [relay2, h1.router, h2.router])
        acked: list[Any] = await asyncio.gather(
            *(
                asyncio.to_thread(probe, tmp_path, m, "publish", f"part.n{i}", str(PER_NODE))
                for i, m in enumerate(machines)
            )
        )
        side_of = {node: i // 3 for i, node in enumerate(ids)}
        # each half holds its own half of the messages and nothing from the other
        during = await eventually(
            lambda: asyncio.sleep(0.2, [received(s) for s in subs]),
            lambda got: all(len(g) >= ALL // 2 for g in got),
            within_s=60,
            what="each half has its own messages",
        )
        crossed = [
            sum(1 for origin, _, _ in g if side_of[origin] != i // 3) for i, g in enumerate(during)
        ]
        lab.unblock_all()
        for sub in subs:
            await asyncio.to_thread(sub.wait, 90)
        got = [sorted(received(s)) for s in subs]
    finally:
        stop_all(procs)
    want = sorted(
        (ids[i], m["origin_seq"], m["id"]) for i, one in enumerate(acked) for m in one["acked"]
    )
    assert ([0] * NODES, [want] * NODES) == (crossed, got)
