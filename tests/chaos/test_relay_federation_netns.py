"""Relays beyond one relay and its members (spec §8): two home nodes behind NAT, each
attached to a different relay, the relays federated, so a frame for the other home node
goes relay → relay → node; and a home node joining through the relay of an inviter that
is itself behind NAT. Both scenarios share one lab and its nodes (home A founded the
community and is attached to relay 1; the joiner is a third home). Real node processes
in network namespaces; no home node can dial another, and the NATs are symmetric
(fully-random) so the direct upgrade fails and the paths stay relayed (the upgrade
itself: test_punch_netns.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hearthnet.identity import KeyPair
from tests.chaos.nat_lab import HomeHost, NatLab, PublicHost
from tests.chaos.relay_lab import launch, start_all, stop_all, url
from tests.chaos.test_relay_netns import (
    both_paths,
    cli,
    paths,
    prepare,
    public_status,
    relayed_in,
    subscribe,
)
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@dataclass
class Federated:
    """The lab, the data root, the two relays, homes A and B, the joiner, and the keys of
    home A, relay 1, relay 2 and home B (in that order; home A founded the community)."""

    lab: NatLab
    root: Path
    relay1: PublicHost
    relay2: PublicHost
    a: HomeHost
    b: HomeHost
    joiner: HomeHost
    keys: list[KeyPair]


@pytest.fixture(scope="module")
def fed(nat_lab_support: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federated]:
    """Relays 1 and 2 federated; home A on relay 1, home B on relay 2; a third home idle."""
    root = tmp_path_factory.mktemp("federated")
    with NatLab(["fully-random"] * 3, public=("relay", "relay2")) as lab:
        relay1, relay2 = lab.public["relay"], lab.public["relay2"]
        home_a, home_b, joiner = lab.homes
        keys = prepare(root, [home_a, relay1, relay2, home_b])
        procs = start_all(
            root,
            [
                # relays federate when each names the other (spec §8)
                (relay2, ("--relay", "--relay-peer", url(relay1))),
                (relay1, ("--relay", "--relay-peer", url(relay2))),
                (home_a, ("--relay-url", url(relay1))),
                (home_b, ("--relay-url", url(relay2))),
            ],
        )
        try:
            yield Federated(lab, root, relay1, relay2, home_a, home_b, joiner, keys)
        finally:
            stop_all(procs)


async def test_two_nat_nodes_publish_and_call_through_federated_relays(fed: Federated) -> None:
    """Home A on relay 1, home B on relay 2, relays federated: pub/sub and a pinned call cross."""
    root, home_a, home_b = fed.root, fed.a, fed.b
    a_keys, r1_keys, r2_keys, b_keys = fed.keys
    want = (("relayed", r1_keys.node_id), ("relayed", r2_keys.node_id))
    seen = await eventually(
        lambda: both_paths(root, home_a, home_b),
        lambda got: (got[0].get(b_keys.node_id), got[1].get(a_keys.node_id)) == want,
        within_s=60,
        what="each home node relayed to the other, each via its own relay",
    )
    sub = subscribe(root, home_b, "home.news", 1)
    try:
        published = await asyncio.to_thread(
            cli, root, home_a, "pub", "home.news", "--json", "--data", '{"n": 42}'
        )
        line = await asyncio.to_thread(sub.wait_for_line, lambda ln: '"n": 42' in ln, 30)
        answer = await asyncio.to_thread(
            cli, root, home_a, "call", "echo", "--body", '{"x": 7}', "--target", b_keys.node_id
        )
        opened = await asyncio.to_thread(relayed_in, root, home_b)
        status = await asyncio.to_thread(public_status, fed.relay1)
    finally:
        stop_all([sub])
    got = json.loads(line)
    assert (want, (published["id"], {"n": 42}), {"echo": {"x": 7}}, True, True) == (
        (seen[0][b_keys.node_id], seen[1][a_keys.node_id]),
        (got["id"], got["data"]),
        answer,
        opened > 0,
        status["relaying"]["relay"]["forwarded"] > 0,
    )


async def test_a_nat_node_joins_through_the_relay_of_an_inviter_behind_nat(
    fed: Federated,
) -> None:
    """The inviter is behind NAT: the new node, behind another NAT, joins through the relay."""
    root, relay, home_a, joiner = fed.root, fed.relay1, fed.a, fed.joiner
    a_keys, relay_keys = fed.keys[0], fed.keys[1]
    await eventually(
        lambda: asyncio.to_thread(public_status, relay),
        lambda got: got["relaying"]["relay"]["members"] == 1,
        within_s=30,
        what="home A attached to relay 1",
    )
    made = home_a.run(
        *home_a.python(
            "-m", "hearthnet.cli", "community", "invite",
            "--data-dir", str(root / home_a.name),
            "--bootstrap", url(home_a), "--relay-url", url(relay),
        ),
        timeout=60,
    )  # fmt: skip
    proc = launch(root, joiner, "--join", made.stdout.strip())
    try:
        proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), 60)
        seen = await eventually(
            lambda: asyncio.to_thread(paths, root, joiner),
            lambda got: got.get(a_keys.node_id) == ("relayed", relay_keys.node_id),
            within_s=60,
            what="the new member relayed to the inviter",
        )
        status = await asyncio.to_thread(public_status, relay)
    finally:
        stop_all([proc])
    assert (("relayed", relay_keys.node_id), 1) == (
        seen[a_keys.node_id],
        status["relaying"]["relay"]["joins_forwarded"],
    )
