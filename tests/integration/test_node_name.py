"""``hearthnet node start --name`` is remembered in the data dir (issue 19): real node
processes on loopback, the CLI run as a process against them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.helpers import run_cli
from tests.integration.mesh_cluster import Cluster, wait_linked


def _status(data_dir: Path) -> dict[str, Any]:
    done = run_cli("node", "status", "--json", "--data-dir", str(data_dir))
    assert 0 == done.returncode, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _peer_names(data_dir: Path) -> dict[str, str | None]:
    done = run_cli("peers", "--json", "--data-dir", str(data_dir))
    assert 0 == done.returncode, done.stderr
    return {row["node"]: row["name"] for row in json.loads(done.stdout)["peers"]}


def test_a_restart_without_name_keeps_the_name_given_before(tmp_path: Path) -> None:
    """Started with --name attic, stopped, started without: still attic in its status and
    in a peer's `peers`; --name cellar renames it, and the next plain start keeps that."""
    cluster = Cluster(tmp_path)
    try:
        cluster.start(0, "--name", "attic")
        named = _status(cluster.data(0))["name"]
        cluster.nodes[0].stop()
        cluster.start(0)
        cluster.start(1)
        asyncio.run(wait_linked(cluster, [0, 1], 1))
        after_restart = (_status(cluster.data(0))["name"], _peer_names(cluster.data(1)))
        cluster.nodes[0].stop()
        cluster.start(0, "--name", "cellar")
        cluster.nodes[0].stop()
        cluster.start(0)
        renamed = _status(cluster.data(0))["name"]
    finally:
        cluster.stop_all()
    node0 = cluster.keys(0).node_id
    assert ("attic", "attic", "attic", "cellar") == (
        named,
        after_restart[0],
        after_restart[1].get(node0),
        renamed,
    )
