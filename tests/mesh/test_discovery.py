"""Zeroconf discovery over real multicast on loopback (127.0.0.1), in one process and across two.

Each test makes a fresh community, so runs in parallel on the same machine (which all
share 224.0.0.251 on loopback) only see each other as "another community".
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import orjson
import pytest

from hearthnet.errors import ConfigError, HearthNetError
from hearthnet.identity import KeyPair
from hearthnet.mesh.announce import Announcement
from hearthnet.mesh.discovery import Discovery
from tests.helpers import wait_until

LOOPBACK = ["127.0.0.1"]
WITHIN_S = 15.0  # registration probes for ~1 s, then answers come within milliseconds


@dataclass
class Seen:
    """What one Discovery reported through its callbacks."""

    found: dict[str, Announcement] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)

    def on_found(self, announcement: Announcement) -> None:
        """Record a found peer."""
        self.found[announcement.node] = announcement

    def on_lost(self, node: str) -> None:
        """Record a lost peer."""
        self.lost.append(node)


def make_discovery(community: str, name: str, port: int) -> tuple[Discovery, Seen, str]:
    """A loopback Discovery for a fresh node of ``community``."""
    node = KeyPair.generate().node_id
    seen = Seen()
    discovery = Discovery(
        Announcement.local(node=node, community=community, name=name, port=port),
        on_found=seen.on_found,
        on_lost=seen.on_lost,
        interfaces=LOOPBACK,
    )
    return discovery, seen, node


@asynccontextmanager
async def running(*discoveries: Discovery) -> AsyncIterator[None]:
    """Start discoveries with run() in a task group, as the node does; stop them after."""
    async with asyncio.TaskGroup() as group:
        for discovery in discoveries:
            await discovery.start()
            group.create_task(discovery.run())
        try:
            yield
        finally:
            for discovery in discoveries:
                await discovery.stop()


async def test_two_nodes_find_each_other_and_ignore_another_community() -> None:
    """Two nodes of one community find each other, never themselves or a foreign node."""
    community = KeyPair.generate().node_id
    a, seen_a, node_a = make_discovery(community, "alpha", 7001)
    b, seen_b, node_b = make_discovery(community, "beta", 7002)
    foreign, seen_foreign, node_foreign = make_discovery(KeyPair.generate().node_id, "x", 7003)
    async with running(a, b, foreign):
        await wait_until(lambda: node_b in seen_a.found and node_a in seen_b.found, WITHIN_S)
        # The foreign node was resolved and ignored (not merely unseen) by both.
        await wait_until(
            lambda: (
                a.statistics().table.ignored_other_community >= 1
                and b.statistics().table.ignored_other_community >= 1
            ),
            WITHIN_S,
            "the foreign node to be seen and ignored",
        )
        peer_b = seen_a.found[node_b]
        assert ({node_b}, {node_a}, (7002, ("127.0.0.1",), "beta"), True) == (
            {n for n in seen_a.found if n != node_foreign},
            {n for n in seen_b.found if n != node_foreign},
            (peer_b.port, peer_b.addresses, peer_b.name),
            a.statistics().announced,
        )
        assert (False, False, {}) == (
            node_foreign in seen_a.found,
            node_foreign in seen_b.found,
            seen_foreign.found,
        )


async def test_goodbye_reports_the_node_lost() -> None:
    """When a node stops, its goodbye makes the other report it lost, and forget it."""
    community = KeyPair.generate().node_id
    a, seen_a, _ = make_discovery(community, "alpha", 7001)
    b, _, node_b = make_discovery(community, "beta", 7002)
    async with running(a):
        await b.start()
        async with asyncio.TaskGroup() as group:
            group.create_task(b.run())
            await wait_until(lambda: node_b in seen_a.found, WITHIN_S)
            await b.stop()
        await wait_until(lambda: node_b in seen_a.lost, WITHIN_S)
        assert ([node_b], ()) == (seen_a.lost, a.peers())


async def test_failing_callback_is_counted_and_discovery_goes_on() -> None:
    """An on_found that raises is counted; the lost event after it is still delivered."""
    community = KeyPair.generate().node_id
    lost: list[str] = []

    def broken(announcement: Announcement) -> None:
        raise RuntimeError("a bug in the caller")

    a = Discovery(
        Announcement.local(node=KeyPair.generate().node_id, community=community, name="a", port=1),
        on_found=broken,
        on_lost=lost.append,
        interfaces=LOOPBACK,
    )
    b, _, node_b = make_discovery(community, "beta", 7002)
    async with running(a):
        await b.start()
        async with asyncio.TaskGroup() as group:
            group.create_task(b.run())
            await wait_until(lambda: a.statistics().callback_errors == 1, WITHIN_S)
            await b.stop()
        await wait_until(lambda: lost == [node_b], WITHIN_S)
        assert 1 == a.statistics().callback_errors


async def test_stop_right_after_start_ends_run() -> None:
    """Stopping while run() is still probing for our name ends run() without an error."""
    discovery, _, _ = make_discovery(KeyPair.generate().node_id, "alpha", 7001)
    await discovery.start()
    async with asyncio.TaskGroup() as group:
        task = group.create_task(discovery.run())
        await asyncio.sleep(0)  # let run() begin probing
        await discovery.stop()
    assert (True, None) == (task.done(), task.exception())


async def test_stopped_discovery_does_not_start_again() -> None:
    """start() after stop() raises: a Discovery is used once."""
    discovery, _, _ = make_discovery(KeyPair.generate().node_id, "alpha", 7001)
    await discovery.start()
    await discovery.stop()
    with pytest.raises(HearthNetError):
        await discovery.start()


async def test_unusable_interface_is_a_config_error() -> None:
    """An interface address this host does not have is refused at start() with ConfigError."""
    discovery = Discovery(
        Announcement.local(
            node=KeyPair.generate().node_id, community=KeyPair.generate().node_id, name="a", port=1
        ),
        on_found=lambda _: None,
        on_lost=lambda _: None,
        interfaces=["192.0.2.77"],  # TEST-NET-1: never assigned to a real interface
    )
    with pytest.raises(ConfigError):
        await discovery.start()


async def test_run_before_start_is_refused() -> None:
    """run() without start() raises instead of waiting forever."""
    discovery, _, _ = make_discovery(KeyPair.generate().node_id, "alpha", 7001)
    with pytest.raises(HearthNetError):
        await discovery.run()


def _discovery_cli(node: str, community: str, name: str, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hearthnet.mesh.discovery",
            *("--name", name, "--node", node, "--community", community, "--port", str(port)),
            *("--interface", "127.0.0.1", "--seconds", "30"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_two_processes_find_each_other_over_loopback() -> None:
    """Two discovery CLI processes on 127.0.0.1 each print the other as found, then exit."""
    community = KeyPair.generate().node_id
    nodes = [KeyPair.generate().node_id for _ in range(2)]
    procs = [_discovery_cli(n, community, f"p{i}", 7100 + i) for i, n in enumerate(nodes)]
    try:
        # Each process stops itself after --seconds; SIGTERM once the other shows up.
        outputs: list[list[dict[str, object]]] = []
        for i, proc in enumerate(procs):
            assert proc.stdout is not None
            lines: list[dict[str, object]] = []
            deadline = time.monotonic() + WITHIN_S
            while time.monotonic() < deadline:
                line = proc.stdout.readline()  # the CLI flushes each line; bounded by --seconds
                if not line:
                    break
                event = orjson.loads(line)
                lines.append(event)
                if event["event"] == "found" and event["node"] == nodes[1 - i]:
                    break
            outputs.append(lines)
        for proc in procs:
            proc.terminate()
        rest = [proc.communicate(timeout=10)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    found = [
        {e["node"] for e in lines if e["event"] == "found" and e["community"] == community}
        for lines in outputs
    ]
    summaries = [orjson.loads(text.splitlines()[-1]) for text in rest]
    assert ([{nodes[1]}, {nodes[0]}], [0, 0], ["summary", "summary"]) == (
        found,
        [p.returncode for p in procs],
        [s["event"] for s in summaries],
    )
