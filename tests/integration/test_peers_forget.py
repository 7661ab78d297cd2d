"""``hearthnet peers forget NODEID|ADDRESS`` against real node processes: the running node
forgets at once and saves it, a stopped node's saved book is edited, and what matched
nothing, or came from another key, is refused (docs/cli.md, docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.helpers import free_port, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, cluster_of, wait_linked


def _json(*args: str) -> Any:
    done = run_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _known(data_dir: Path) -> dict[str | None, list[str]]:
    """NodeID (None: unknown) -> addresses of the rows ``peers`` lists as known."""
    rows = _json("peers", "--data-dir", str(data_dir))["peers"]
    return {r["node"]: r["urls"] for r in rows if not r["linked"]}


def _saved(data_dir: Path) -> list[str]:
    """The URLs in the node's saved address book."""
    book = json.loads((data_dir / "mesh" / "peers.json").read_text())
    return [a["url"] for a in book["addresses"]]


def test_a_node_that_left_is_forgotten_by_the_running_node_and_stays_forgotten(
    tmp_path: Path,
) -> None:
    """Node 1 stops for good: node 0 lists it as known; ``peers forget NODEID`` on node 0
    (running) takes its address out of the list and out of the saved book at once, and
    after node 0 restarts it is still gone; asked again, nothing matches (exit 1). Node
    1's key may not make node 0 forget anything (forbidden)."""
    with cluster_of(tmp_path, 2) as cluster:
        asyncio.run(wait_linked(cluster, [0, 1], 1))
        gone, url = cluster.nodes[1].fields["node"], cluster.nodes[1].url
        zero = str(cluster.data(0))
        stranger = run_cli(
            *("peers", "forget", gone, "--url", cluster.nodes[0].url),
            *("--data-dir", str(cluster.data(1)), "--json"),
        )
        cluster.nodes[1].stop()
        asyncio.run(wait_linked(cluster, [0], 0))
        before = _known(cluster.data(0))
        forgot = run_cli("peers", "forget", gone, "--data-dir", zero)
        after, saved = _known(cluster.data(0)), _saved(cluster.data(0))
        again = run_cli("peers", "forget", gone, "--data-dir", zero)
        cluster.nodes[0].stop()
        cluster.start(0)
        restarted = _known(cluster.data(0))
    assert (
        (1, "forbidden"),
        [url],
        (0, f"forgot 1 address of {gone}: {url}; no longer dialled", ""),
        (None, False),
        (1, True),
        None,
    ) == (
        (stranger.returncode, json.loads(stranger.stderr)["error"]),
        before.get(gone),
        (forgot.returncode, forgot.stdout.strip(), forgot.stderr),
        (after.get(gone), url in saved),
        (again.returncode, f"no known address matches {gone}" in again.stderr),
        restarted.get(gone),
    )


def test_a_stopped_node_s_saved_book_is_edited_and_a_configured_peer_is_named(
    tmp_path: Path,
) -> None:
    """A ``--peer`` nobody answers at: forgotten by address (``host:port``) while the node
    runs, with a note that the configuration brings it back at the next start; with the
    node stopped, forgetting it edits the saved book (JSON answer, no link named); a
    NodeID typo is a usage error (2)."""
    data = tmp_path / "data"
    nobody = f"127.0.0.1:{free_port()}"
    node = start_node_process(data, *MESH_ARGS, "--peer", f"http://{nobody}")
    try:
        running = run_cli("peers", "forget", nobody, "--data-dir", str(data))
    finally:
        node.stop()
    # the next start dials the configured peer again; stopped, it is in the saved book
    start_node_process(data, *MESH_ARGS, "--peer", f"http://{nobody}").stop()
    saved_before = _saved(data)
    stopped = _json("peers", "forget", f"http://{nobody}", "--data-dir", str(data))
    typo = run_cli("peers", "forget", "ed25519:abc", "--data-dir", str(data))
    assert (
        (0, True),
        [f"http://{nobody}"],
        {
            "target": f"http://{nobody}",
            "forgotten": [f"http://{nobody}"],
            "linked": [],
            "configured": [],
        },
        [],
        (2, True),
    ) == (
        (running.returncode, "is configured" in running.stderr and "next start" in running.stderr),
        saved_before,
        stopped,
        _saved(data),
        (typo.returncode, "not a NodeID or a peer address" in typo.stderr),
    )
