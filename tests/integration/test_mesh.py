"""The mesh with real node processes on loopback (spec §7, issue: the mesh).

Nodes join one community through invites (``--join``, which also bootstraps the peer
list); node 0 founded it. Timers are shortened through the environment. The scenarios
on three nodes share one cluster (``trio``), each starting once all three are linked;
the revocation, which removes node 2 for good, runs last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.errors import Forbidden, Revoked, Unauthorized
from hearthnet.identity import load_or_create_keys
from hearthnet.subscription import Delivery
from tests.helpers import (
    NodeProcess,
    eventually,
    hearthnet_cmd,
    run_cli,
    start_node_process,
    wait_until,
)
from tests.integration.mesh_cluster import FAST_MESH, Cluster, cluster_of, status_of, wait_linked

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes of one community, started once for the module's scenarios."""
    with cluster_of(tmp_path_factory.mktemp("trio"), 3) as cluster:
        yield cluster


async def linked_trio(cluster: Cluster) -> Cluster:
    """The shared cluster once every node has both others linked again."""
    await wait_linked(cluster, [0, 1, 2], at_least=2)
    return cluster


async def collect(
    client: Client, pattern: str, count: int, within_s: float = 20.0
) -> list[Delivery]:
    """Subscribe and gather ``count`` deliveries."""
    got: list[Delivery] = []
    async with client.subscribe(pattern, since={"last": 1000}, first_backoff_s=0.05) as sub:
        async with asyncio.timeout(within_s):
            async for item in sub:
                if isinstance(item, Delivery):
                    got.append(item)
                    if len(got) >= count:
                        break
    return got


async def test_a_message_published_on_any_node_reaches_every_node(tmp_path: Path) -> None:
    """Five nodes: each publishes one message; every node's subscriber gets all five."""
    with cluster_of(tmp_path, 5) as cluster:
        await wait_linked(cluster, list(range(5)), at_least=2)
        clients = [cluster.client(i) for i in range(5)]
        try:
            for i, client in enumerate(clients):
                await client.publish(f"news.n{i}", "note", {"from": i})
            results = await asyncio.gather(*(collect(c, "news.*", 5) for c in clients))
        finally:
            for client in clients:
                await client.close()
    assert [[0, 1, 2, 3, 4]] * 5 == [sorted(d.data["from"] for d in got) for got in results]


async def test_killed_node_catches_up_after_restart(trio: Cluster) -> None:
    """kill -9 one node, publish elsewhere, restart it: it holds everything in retention."""
    cluster = await linked_trio(trio)
    cluster.kill(2)
    async with cluster.client(0) as c0, cluster.client(1) as c1:
        for i in range(30):
            await (c0 if i % 2 else c1).publish("missed", "m", {"i": i})
    cluster.start(2)
    async with cluster.client(2) as c2:
        got = await collect(c2, "missed", 30)
    assert [*range(30)] == sorted(d.data["i"] for d in got)


async def test_remote_calls_plain_stream_and_cancel(trio: Cluster) -> None:
    """A call pinned to another node runs there: unary, a stream with acks, and a cancel
    that ends the remote stream within 200 ms."""
    cluster = await linked_trio(trio)
    target = cluster.keys(2).node_id
    async with cluster.client(0) as c0:
        plain = await c0.call_with_meta("echo@1.0", {"x": 1}, target=target)
        async with c0.stream("echo.stream@1.0", {"count": 100, "size": 4}, target=target) as s:
            frames = await s.collect()
        async with c0.stream(
            "echo.stream@1.0", {"count": 10_000, "interval_ms": 10}, target=target
        ) as slow:
            async for frame in slow:
                if frame.data.get("i") == 5:
                    sent = time.monotonic()
                    await slow.cancel()
                if frame.terminal:
                    ended = time.monotonic()
                    last = frame
    assert (target, {"echo": {"x": 1}}, 100, "done", ("error", "cancelled")) == (
        plain["meta"]["node"],
        plain["output"],
        sum(1 for f in frames if f.event == "token"),
        frames[-1].event,
        (last.event, last.data["code"]),
    )
    assert ended - sent < 0.2


async def test_a_non_member_cannot_link_call_or_subscribe(trio: Cluster, tmp_path: Path) -> None:
    """A node of another community is refused a link; its key cannot call or subscribe."""
    cluster = await linked_trio(trio)
    stranger = start_node_process(
        tmp_path / "stranger",
        "--no-zeroconf",
        "--port",
        "0",
        "--peer",
        cluster.nodes[0].url,
        env=FAST_MESH,
    )
    try:
        keys = load_or_create_keys(tmp_path / "stranger")
        async with Client(cluster.nodes[0].url, keys=keys) as c:
            with pytest.raises(Unauthorized):
                await c.call("echo@1.0", 1)
            with pytest.raises(Unauthorized):
                async with c.subscribe("x"):
                    pass

        def refused() -> bool:
            return 'hearthnet_mesh_refused_total{reason="unauthorized"}' in _metrics(cluster, 0)

        await wait_until(refused, within_s=10, what="the stranger's link to be refused")
        assert 0 == status_of(stranger)["peers_linked"]
    finally:
        stranger.stop()


async def test_a_full_node_refers_a_newcomer_to_other_members(tmp_path: Path) -> None:
    """Node 0 takes two links (D = 1); a third joiner that knows only node 0 is refused a
    link but handed the members' addresses, and links to one of them."""
    cluster = Cluster(tmp_path, env={**FAST_MESH, "HEARTHNET_MESH_MAX_LINKS": "1"})
    try:
        cluster.start(0)
        cluster.env = FAST_MESH
        for i in (1, 2):
            cluster.start(i)
        await wait_linked(cluster, [0], at_least=2)
        cluster.start(3)
        await wait_linked(cluster, [3], at_least=1)
        assert 'hearthnet_mesh_refused_total{reason="full"}' in _metrics(cluster, 0)
        assert 2 == status_of(cluster.nodes[0])["peers_linked"]
    finally:
        cluster.stop_all()


async def drain(sub: Any) -> None:
    """Read a subscription until it ends (it should end with an error)."""
    async with asyncio.timeout(10):
        async for _ in sub:
            pass


def linked_to_one(node: NodeProcess) -> bool:
    """Whether ``node`` has exactly one linked peer."""
    linked: int = status_of(node)["peers_linked"]
    return 1 == linked


def _metrics(cluster: Cluster, i: int) -> str:
    with urllib.request.urlopen(cluster.nodes[i].url + "/metrics", timeout=5) as resp:
        body: bytes = resp.read()
        return body.decode()


async def test_presence_is_seen_across_nodes(trio: Cluster) -> None:
    """A member present on node 0's topic shows in node 1's presence list, and leaves."""
    cluster = await linked_trio(trio)
    async with cluster.client(0) as c0, cluster.client(1) as c1:

        async def present() -> list[str | None]:
            return [m.get("name") for m in await c1.presence("room.1")]

        async with c0.subscribe("room.1", presence={"name": "Ann"}) as sub:
            seen = await eventually(present, lambda names: names == ["Ann"], what="Ann on node 1")
            await sub.close()
        after = await eventually(present, lambda names: names == [], what="Ann to leave")
    assert (["Ann"], []) == (seen, after)


async def test_community_rules_set_on_one_node_are_enforced_on_every_node(
    trio: Cluster, tmp_path: Path
) -> None:
    """`community rules FILE` on the founder signs the rules; node 1 learns them by
    gossip and refuses what they forbid, also to a live subscription (spec §6.9)."""
    rules_file = tmp_path / "rules.toml"
    rules_file.write_text(
        '[[pubsub.rules]]\npattern = "ops.**"\nsubscribe = "anchor"\npublish = "anchor"\n'
        '[[pubsub.rules]]\npattern = "**"\nsubscribe = "member"\npublish = "member"\n',
        encoding="utf-8",
    )
    cluster = await linked_trio(trio)
    async with cluster.client(1) as member:
        async with member.subscribe("ops.alerts", first_backoff_s=0.05) as watching:
            done = await asyncio.to_thread(
                subprocess.run,
                hearthnet_cmd(
                    "community", "rules", str(rules_file), "--data-dir", str(cluster.data(0))
                ),
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 0, done.stderr
            with pytest.raises(Forbidden):
                await drain(watching)  # node 1 ended the subscription itself
        with pytest.raises(Forbidden):
            await member.publish("ops.alerts", "note", {"x": 1})
        await member.publish("chat.room", "note", {"x": 1})  # still allowed
    shown = await asyncio.to_thread(
        run_cli, "community", "show", "--json", "--data-dir", str(cluster.data(1))
    )
    assert json.loads(shown.stdout)["pubsub_rules"][0] == {
        "pattern": "ops.**",
        "subscribe": "anchor",
        "publish": "anchor",
    }


async def test_revoked_member_is_cut_off_everywhere_within_10s(trio: Cluster) -> None:
    """Revoking node 2 closes its links on every node and its sessions; it cannot come back."""
    cluster = await linked_trio(trio)
    revoked = cluster.keys(2)
    async with Client(cluster.nodes[1].url, keys=revoked) as c2:
        sub_cm = c2.subscribe("watch", first_backoff_s=0.05)
        sub = await sub_cm.__aenter__()
        await asyncio.to_thread(
            subprocess.run,
            hearthnet_cmd(
                "community", "revoke", revoked.node_id, "--data-dir", str(cluster.data(0))
            ),
            check=True,
            capture_output=True,
            timeout=30,
        )
        # Timed from node 0 holding the revocation (the command has returned), not from
        # starting the command's process, which takes seconds on a loaded machine.
        started = time.monotonic()
        for i in (0, 1):
            await wait_until(
                partial(linked_to_one, cluster.nodes[i]),
                within_s=10,
                what=f"node {i} to drop the revoked node",
            )
        elapsed = time.monotonic() - started
        with pytest.raises(Revoked):
            await drain(sub)
        with contextlib.suppress(Exception):
            await sub_cm.__aexit__(None, None, None)
        with pytest.raises(Revoked):
            await c2.call("echo@1.0", 1)
    assert elapsed < 10
