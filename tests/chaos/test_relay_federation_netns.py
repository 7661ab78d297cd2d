"""Relays beyond one relay and its members (spec §8): two home nodes behind NAT, each
attached to a different relay, the relays federated, so a frame for the other home node
goes relay → relay → node; and a home node joining through the relay of an inviter that
is itself behind NAT. Real node processes in network namespaces; neither home node can
dial the other, and the NATs are symmetric (fully-random) so the direct upgrade fails
and the paths stay relayed (the upgrade itself: test_punch_netns.py)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from tests.chaos.conftest import MakeNatLab
from tests.chaos.netns import HostProcess
from tests.chaos.test_relay_netns import (
    PORT,
    both_paths,
    cli,
    paths,
    prepare,
    public_status,
    relayed_in,
    start,
    subscribe,
)
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


async def test_two_nat_nodes_publish_and_call_through_federated_relays(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """Home A on relay 1, home B on relay 2, relays federated: pub/sub and a pinned call cross."""
    lab = make_nat_lab(["fully-random", "fully-random"], public=("relay", "relay2"))
    relay1, relay2 = lab.public["relay"], lab.public["relay2"]
    home_a, home_b = lab.homes
    r1_keys, r2_keys, a_keys, b_keys = prepare(tmp_path, [relay1, relay2, home_a, home_b])
    url1, url2 = f"http://{relay1.ip}:{PORT}", f"http://{relay2.ip}:{PORT}"
    procs: list[HostProcess] = []
    try:
        # relays federate when each names the other (spec §8)
        procs.append(start(tmp_path, relay2, "--relay", "--relay-peer", url1))
        procs.append(start(tmp_path, relay1, "--relay", "--relay-peer", url2))
        procs.append(start(tmp_path, home_a, "--relay-url", url1))
        procs.append(start(tmp_path, home_b, "--relay-url", url2))
        want = (("relayed", r1_keys.node_id), ("relayed", r2_keys.node_id))
        seen = await eventually(
            lambda: both_paths(tmp_path, home_a, home_b),
            lambda got: (got[0].get(b_keys.node_id), got[1].get(a_keys.node_id)) == want,
            within_s=60,
            what="each home node relayed to the other, each via its own relay",
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
        status = await asyncio.to_thread(public_status, relay1)
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)
    got = json.loads(line)
    assert (want, (published["id"], {"n": 42}), {"echo": {"x": 7}}, True, True) == (
        (seen[0][b_keys.node_id], seen[1][a_keys.node_id]),
        (got["id"], got["data"]),
        answer,
        opened > 0,
        status["relaying"]["relay"]["forwarded"] > 0,
    )


async def test_a_nat_node_joins_through_the_relay_of_an_inviter_behind_nat(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """The inviter is behind NAT: the new node, behind another NAT, joins through the relay."""
    lab = make_nat_lab(["fully-random", "fully-random"], public=("relay",))
    relay = lab.public["relay"]
    home_a, home_b = lab.homes
    a_keys, relay_keys = prepare(tmp_path, [home_a, relay])  # home A founded the community
    relay_url = f"http://{relay.ip}:{PORT}"
    procs: list[HostProcess] = []
    try:
        procs.append(start(tmp_path, relay, "--relay"))
        procs.append(start(tmp_path, home_a, "--relay-url", relay_url))
        await eventually(
            lambda: asyncio.to_thread(public_status, relay),
            lambda got: got["relaying"]["relay"]["members"] == 1,
            within_s=30,
            what="home A attached to the relay",
        )
        made = home_a.run(
            *home_a.python(
                "-m", "hearthnet.cli", "community", "invite",
                "--data-dir", str(tmp_path / home_a.name),
                "--bootstrap", f"http://{home_a.ip}:{PORT}", "--relay-url", relay_url,
            ),
            timeout=60,
        )  # fmt: skip
        procs.append(start(tmp_path, home_b, "--join", made.stdout.strip()))
        seen = await eventually(
            lambda: asyncio.to_thread(paths, tmp_path, home_b),
            lambda got: got.get(a_keys.node_id) == ("relayed", relay_keys.node_id),
            within_s=60,
            what="the new member relayed to the inviter",
        )
        status = await asyncio.to_thread(public_status, relay)
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)
    assert (("relayed", relay_keys.node_id), 1) == (
        seen[a_keys.node_id],
        status["relaying"]["relay"]["joins_forwarded"],
    )
