"""``hearthnet peers`` shows the address a direct link really uses (``remote``: the ip:port
its socket is connected to), beside the URL the peer claims: two node processes on
loopback, the command run as a process against each."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.helpers import run_cli
from tests.integration.mesh_cluster import cluster_of, wait_linked


def _peers(data_dir: Path) -> list[dict[str, Any]]:
    done = run_cli("peers", "--json", "--data-dir", str(data_dir))
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)["peers"]
    return [row for row in rows if row["linked"]]


def test_peers_shows_the_address_a_direct_link_uses(tmp_path: Path) -> None:
    """Node 1 joined through node 0, one direct link between them: the end that dialled
    sees the other's listening address as ``remote``; the end that accepted sees the
    dialler's own port (not the one its URL claims); both rows are ``direct``, no
    ``via``; and the table has a ``remote`` column."""
    with cluster_of(tmp_path, 2) as cluster:
        asyncio.run(wait_linked(cluster, [0, 1], 1))
        rows = [_peers(cluster.data(i))[0] for i in (0, 1)]
        table = run_cli("peers", "--data-dir", str(cluster.data(0))).stdout
        listening = [urlsplit(node.url).port for node in cluster.nodes]
    seen = []
    for i, row in enumerate(rows):
        host, port = row["remote"].rsplit(":", 1)
        other = listening[1 - i]
        where = "listening" if int(port) == other else "another port"
        seen.append((row["direction"], row["path"], row["via"], host, where))
    # the dialler's end of the link: the other's listening port; the acceptor's: not
    expected = [
        (d, "direct", None, "127.0.0.1", "listening" if d == "outbound" else "another port")
        for d, *_ in seen
    ]
    assert (expected, {"outbound", "inbound"}, True) == (
        seen,
        {s[0] for s in seen},
        "remote" in table.splitlines()[0],
    )
