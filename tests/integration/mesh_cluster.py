"""A cluster of real node processes on loopback, joined by invites (test helper)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hearthnet.client import Client
from hearthnet.identity import KeyPair, load_or_create_keys
from tests.helpers import NodeProcess, hearthnet_cmd, start_node_process

FAST_MESH = {
    "HEARTHNET_MESH_ANTI_ENTROPY_S": "0.5",
    "HEARTHNET_MESH_CAPS_S": "1",
    "HEARTHNET_MESH_DIAL_INTERVAL_S": "0.1",
    "HEARTHNET_MESH_HEARTBEAT_S": "1",
    "HEARTHNET_MESH_PRESENCE_REFRESH_S": "1",
    "HEARTHNET_PUBSUB_SYNC": "normal",
}
MESH_ARGS = ("--no-zeroconf",)


def invite(data_dir: Path, url: str) -> str:
    """An invite from the node in ``data_dir``, bootstrapping at ``url``."""
    result = subprocess.run(
        hearthnet_cmd("community", "invite", "--data-dir", str(data_dir), "--bootstrap", url),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


class Cluster:
    """Nodes of one community; index 0 founded it."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = FAST_MESH if env is None else env
        self.nodes: list[NodeProcess] = []
        self.ports: list[int] = []

    def data(self, i: int) -> Path:
        """Data dir of node i."""
        return self.root / f"n{i}"

    def keys(self, i: int) -> KeyPair:
        """Keys of node i."""
        return load_or_create_keys(self.data(i))

    def start(self, i: int, *extra: str, join: bool = True, port: int = 0) -> NodeProcess:
        """Start node i (joining through node 0 unless it is node 0 or already a member)."""
        args = [*MESH_ARGS, "--port", str(port), *extra]
        if i > 0 and join and not (self.data(i) / "community" / "records.jsonl").exists():
            args += ["--join", invite(self.data(0), self.nodes[0].url)]
        node = start_node_process(self.data(i), *args, env=self.env)
        if i < len(self.nodes):
            self.nodes[i] = node
        else:
            self.nodes.append(node)
        return node

    def kill(self, i: int) -> None:
        """kill -9 node i."""
        self.nodes[i].stop(signal.SIGKILL)

    def client(self, i: int) -> Client:
        """A client of node i signing as node i."""
        return Client(self.nodes[i].url, keys=self.keys(i))

    def stop_all(self) -> None:
        """SIGTERM every node still running."""
        for node in self.nodes:
            node.stop()


async def wait_linked(
    cluster: Cluster, indexes: list[int], at_least: int, within_s: float = 30.0
) -> None:
    """Until each listed node has at least ``at_least`` peer links."""
    deadline = time.monotonic() + within_s
    while True:
        counts = []
        for i in indexes:
            async with Client(cluster.nodes[i].url, keys=cluster.keys(i)) as c:
                counts.append((await c.get_json("/status"))["peers_linked"])
        if all(c >= at_least for c in counts):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"links per node {counts}, wanted {at_least}")
        await asyncio.sleep(0.1)


@contextmanager
def cluster_of(root: Path, n: int) -> Iterator[Cluster]:
    """Start n nodes of one community (node 0 founds it, the others join through it)."""
    cluster = Cluster(root)
    try:
        for i in range(n):
            cluster.start(i)
        yield cluster
    finally:
        cluster.stop_all()


def status_of(node: NodeProcess) -> dict[str, Any]:
    """/status of a node (sync, for quick checks)."""
    with urllib.request.urlopen(node.url + "/status", timeout=5) as resp:
        result: dict[str, Any] = json.load(resp)
        return result
