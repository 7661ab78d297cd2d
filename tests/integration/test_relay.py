"""Relayed paths with real node processes on loopback (spec §8).

Node 0 founds the community and serves as a relay (``--relay``); nodes 1 and 2 join
through it and attach to it (``--relay-url``) while advertising an address nobody can
dial, so the only way between them is through the relay.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.errors import HearthNetError
from tests.helpers import eventually, free_port, run_cli
from tests.integration.mesh_cluster import FAST_MESH, Cluster, status_of

pytestmark = pytest.mark.slow

UNDIALLABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there
# on loopback nothing filters, so a punch is a race of plain dials: these paths stay relayed
NO_UPGRADE = {**FAST_MESH, "HEARTHNET_MESH_DIRECT_UPGRADE": "false"}


def relayed_frames_in(cluster: Cluster, i: int) -> float:
    """Route frames node i opened (``hearthnet_relayed_frames{direction="in"}``)."""
    with urllib.request.urlopen(cluster.nodes[i].url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith('hearthnet_relayed_frames{direction="in"}'):
            return float(line.split()[-1])
    return 0.0


async def _peers(cluster: Cluster, i: int) -> Any:
    """What ``hearthnet peers --json`` shows for node i (a request, not a process per poll)."""
    async with cluster.client(i) as client:
        return await client.request_json("GET", "/mesh/v1/peers")


def paths(cluster: Cluster, i: int) -> dict[str, tuple[str, str | None]]:
    """``{peer: (path, via)}`` of node i's linked peers that answered a ping (a pong on a
    path comes after the greeting frames, capability routes included, that went first)."""
    peers: list[dict[str, Any]] = asyncio.run(_peers(cluster, i))["peers"]
    return {
        p["node"]: (p["path"], p["via"])
        for p in peers
        if p["linked"] and p["rtt_ms_p50"] is not None
    }


async def test_two_undiallable_nodes_call_and_stream_through_a_relay(tmp_path: Path) -> None:
    """Undiallable nodes see each other relayed; calls, streams and heartbeats use that path."""
    # node 1 is given --relay-url, node 2 gets the relay from its invite;
    # the stream goes over SSE: the bus WebSocket does not take a target yet
    cluster = Cluster(tmp_path, NO_UPGRADE)
    try:
        cluster.start(0, "--relay")
        url = cluster.nodes[0].url
        cluster.start(1, "--relay-url", url, "--advertise-url", UNDIALLABLE)
        made = run_cli(
            "community", "invite", "--data-dir", str(cluster.data(0)),
            "--bootstrap", url, "--relay-url", url,
        )  # fmt: skip
        cluster.start(2, "--join", made.stdout.strip(), "--advertise-url", UNDIALLABLE, join=False)
        relay, one, two = (cluster.keys(i).node_id for i in range(3))
        want = (
            {relay: ("direct", None), two: ("relayed", relay)},
            {relay: ("direct", None), one: ("relayed", relay)},
        )
        seen = await eventually(
            lambda: asyncio.gather(
                asyncio.to_thread(paths, cluster, 1), asyncio.to_thread(paths, cluster, 2)
            ),
            lambda got: tuple(got) == want,
            within_s=30,
            what="nodes 1 and 2 relayed to each other",
        )
        before = relayed_frames_in(cluster, 1)
        async with Client(cluster.nodes[1].url, keys=cluster.keys(1)) as client:
            plain = await client.call_with_meta("echo@1.0", {"x": 1}, target=two)
            async with client.stream(
                "echo.stream@1.0", {"count": 100, "size": 4}, target=two, prefer_ws=False
            ) as stream:
                frames = await stream.collect()
        opened = relayed_frames_in(cluster, 1) - before
        status = status_of(cluster.nodes[1])["relaying"]["paths"]
        async with Client(cluster.nodes[1].url, keys=cluster.keys(1)) as signed:
            listed = (await signed.get_json("/manifest"))["relays"]
    finally:
        cluster.stop_all()
    records = [
        json.loads(line)
        for day in sorted((cluster.data(1) / "heartbeats").glob("*.jsonl"))
        for line in day.read_text().splitlines()
    ]
    pong_paths = {
        (r["path"], r["via"]) for r in records if r["peer"] == two and r["kind"] == "pong"
    }
    assert (
        want,
        two,
        {"echo": {"x": 1}},
        100,
        "done",
        True,
        1,
        {("relay", relay)},
        [cluster.nodes[0].url],
    ) == (
        tuple(seen),
        plain["meta"]["node"],
        plain["output"],
        sum(1 for f in frames if f.event == "token"),
        frames[-1].event,
        opened >= 100,
        status["relayed"],
        pong_paths,
        listed,
    )


async def test_members_reattach_after_the_relay_is_killed_and_restarted(tmp_path: Path) -> None:
    """kill -9 the relay, start it again on its port: the relayed path comes back."""
    cluster = Cluster(tmp_path, NO_UPGRADE)
    try:
        cluster.start(0, "--relay")
        relay_url = cluster.nodes[0].url
        for i in (1, 2):
            cluster.start(i, "--relay-url", relay_url, "--advertise-url", UNDIALLABLE)
        relay, two = cluster.keys(0).node_id, cluster.keys(2).node_id

        async def relayed_to_two() -> bool:
            got = await asyncio.to_thread(paths, cluster, 1)
            return got.get(two) == ("relayed", relay)

        await eventually(relayed_to_two, bool, within_s=30, what="relayed before the kill")
        cluster.kill(0)
        cluster.start(0, "--relay", port=int(relay_url.rsplit(":", 1)[1]))
        before = relayed_frames_in(cluster, 1)

        async def answer() -> Any:
            async with Client(cluster.nodes[1].url, keys=cluster.keys(1)) as client:
                try:
                    return await client.call_with_meta("echo@1.0", {"x": 2}, target=two)
                except HearthNetError:
                    return None

        reply = await eventually(
            answer, lambda r: r is not None, within_s=30, what="a call after the restart"
        )
        back = await eventually(relayed_to_two, bool, within_s=30, what="relayed again")
        opened = relayed_frames_in(cluster, 1) - before
    finally:
        cluster.stop_all()
    assert ((two, {"echo": {"x": 2}}), True, True) == (
        (reply["meta"]["node"], reply["output"]),
        back,
        opened > 0,
    )


async def test_a_node_joins_through_the_relay_when_the_inviter_cannot_be_dialled(
    tmp_path: Path,
) -> None:
    """The invite's bootstrap is undiallable: the relay carries the join to the inviter.
    The invite is made as a user would, without naming the relay: the running inviter's
    manifest says which relays it is reached through (spec §8)."""
    cluster = Cluster(tmp_path, NO_UPGRADE)
    try:
        cluster.start(0)
        cluster.start(1, "--relay")
        relay_url = cluster.nodes[1].url
        cluster.nodes[0].stop()
        cluster.start(0, "--relay-url", relay_url, "--advertise-url", UNDIALLABLE)
        inviter, relay = cluster.keys(0).node_id, cluster.keys(1).node_id
        await eventually(
            lambda: asyncio.to_thread(status_of, cluster.nodes[1]),
            lambda got: got["relaying"]["relay"]["members"] >= 1,
            within_s=30,
            what="the inviter attached to the relay",
        )
        made = run_cli(
            "community", "invite", "--json", "--data-dir", str(cluster.data(0)),
            "--bootstrap", UNDIALLABLE,
        )  # fmt: skip
        invite = json.loads(made.stdout)
        cluster.start(2, "--join", invite["invite"], "--advertise-url", UNDIALLABLE, join=False)
        seen = await eventually(
            lambda: asyncio.to_thread(paths, cluster, 2),
            lambda got: got.get(inviter) == ("relayed", relay),
            within_s=30,
            what="the new member relayed to the inviter",
        )
        forwarded = status_of(cluster.nodes[1])["relaying"]["relay"]["joins_forwarded"]
    finally:
        cluster.stop_all()
    assert ([relay_url], ("relayed", relay), 1) == (invite["relays"], seen[inviter], forwarded)


async def test_killing_the_relay_in_use_moves_relayed_peers_to_the_other(tmp_path: Path) -> None:
    """Members with two federated relays: kill -9 the one in use, calls go on via the other."""
    cluster = Cluster(tmp_path, NO_UPGRADE)
    try:
        ports = (free_port(), free_port())  # relays federate when each names the other
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        cluster.start(0, "--relay", "--relay-peer", urls[1], port=ports[0])
        cluster.start(1, "--relay", "--relay-peer", urls[0], port=ports[1])
        both = ("--relay-url", cluster.nodes[0].url, "--relay-url", cluster.nodes[1].url)
        for i in (2, 3):
            cluster.start(i, *both, "--advertise-url", UNDIALLABLE)
        relays, three = {cluster.keys(i).node_id: i for i in (0, 1)}, cluster.keys(3).node_id
        before = await eventually(
            lambda: asyncio.to_thread(paths, cluster, 2),
            lambda got: got.get(three, ("", None))[0] == "relayed",
            within_s=30,
            what="node 2 relayed to node 3",
        )
        used = before[three][1]
        other = next(r for r in relays if r != used)
        killed_at = time.monotonic()
        cluster.kill(relays[used])

        async def answer() -> Any:
            async with Client(cluster.nodes[2].url, keys=cluster.keys(2)) as client:
                try:
                    return await client.call_with_meta("echo@1.0", {"x": 4}, target=three)
                except HearthNetError:
                    return None

        reply = await eventually(answer, lambda r: r is not None, within_s=15, what="a call")
        resumed_s = time.monotonic() - killed_at
        after = await eventually(
            lambda: asyncio.to_thread(paths, cluster, 2),
            lambda got: got.get(three) == ("relayed", other),
            within_s=15,
            what="node 2 relayed to node 3 through the other relay",
        )
        moved_s = time.monotonic() - killed_at
    finally:
        cluster.stop_all()
    print(f"relay failover on loopback: a call {resumed_s:.2f} s, the path {moved_s:.2f} s")
    assert ((three, {"echo": {"x": 4}}), ("relayed", other), True) == (
        (reply["meta"]["node"], reply["output"]),
        after[three],
        moved_s <= 15,
    )


async def test_an_invite_made_on_a_relay_names_it_and_a_member_is_told_who_invites(
    tmp_path: Path,
) -> None:
    """``community invite`` on a node started with ``--relay`` and no ``--relay-url``
    names that node as the relay, so the new member attaches to it; a member's own
    ``community invite`` is refused with what to do instead."""
    cluster = Cluster(tmp_path, NO_UPGRADE)
    try:
        relay = cluster.start(0, "--relay")
        made = run_cli("community", "invite", "--json", "--data-dir", str(cluster.data(0)))
        invite = json.loads(made.stdout)
        mesh_url = status_of(relay)["mesh_url"]
        assert ([mesh_url], [mesh_url]) == (invite["bootstrap"], invite["relays"])
        member = cluster.start(1, "--join", invite["invite"], join=False)
        relay_id = cluster.keys(0).node_id
        await eventually(
            lambda: asyncio.to_thread(status_of, member),
            lambda s: relay_id in s["relaying"].get("paths", {}).get("relays", ""),
            30,
            "the member attached to the relay",
        )
        refused = run_cli("community", "invite", "--data-dir", str(cluster.data(1)))
        assert 1 == refused.returncode
        assert "this node is member" in refused.stderr
        assert "hearthnet community level" in refused.stderr  # how an anchor raises it
    finally:
        cluster.stop_all()
