"""A federated community's node behind a relay, used with the CLI as docs/federation.md
("Through a relay") tells an operator to: real node processes on loopback.

Community A: node 0 founds it and relays, node 1 joins and attaches to it (both
advertise an address nobody can dial, so node 1 is reached through the relay only).
Community B: node B bridges to node 1 through A's relay (``--federation-peer mesh:...``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import NodeProcess, eventually, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, Cluster
from tests.integration.test_relay import NO_UPGRADE, UNDIALLABLE

pytestmark = pytest.mark.slow


def cli(*args: str) -> str:
    """Run the CLI; its stdout (it must succeed)."""
    done = run_cli(*args)
    assert 0 == done.returncode, done.stderr
    return done.stdout


async def cli_async(*args: str) -> subprocess.CompletedProcess[str]:
    """:func:`run_cli` off the event loop."""
    return await asyncio.to_thread(run_cli, *args)


async def test_cli_calls_and_lists_a_federated_node_through_a_relay(tmp_path: Path) -> None:
    """``hearthnet call CAP --target NODE`` reaches a node of the federated community
    through the relay (granted capabilities answer, others are ``forbidden``), and
    ``hearthnet peers`` lists each linked node once, by name."""
    cluster = Cluster(tmp_path, NO_UPGRADE)
    b_dir = tmp_path / "b"
    b: NodeProcess | None = None
    try:
        relay = cluster.start(0, "--relay")
        cluster.start(1, "--relay-url", relay.url, "--advertise-url", UNDIALLABLE)
        b = start_node_process(b_dir, *MESH_ARGS, env=NO_UPGRADE)  # founds B
        a0, a1 = cluster.keys(0).node_id, cluster.keys(1).node_id
        b_id = json.loads(cli("keys", "show", "--json", "--data-dir", str(b_dir)))["node"]
        proposal, signed = tmp_path / "proposal.hnf", tmp_path / "signed.hnf"
        cli(
            *("federation", "propose", "--data-dir", str(cluster.data(0)), "--with", b_id),
            *("--grant-capabilities", "echo@1", "--expires", "1d", "--out", str(proposal)),
            *("--bridges", a1, "--their-bridges", b_id),
        )
        cli("federation", "accept", "--data-dir", str(b_dir), str(proposal), "--out", str(signed))
        cli("federation", "accept", "--data-dir", str(cluster.data(0)), str(signed))
        b.stop()
        b = start_node_process(
            b_dir,
            *MESH_ARGS,
            *("--relay-url", relay.url, "--federation-peer", f"mesh:{a1}"),
            *("--advertise-url", UNDIALLABLE),
            env=NO_UPGRADE,
        )

        def call(capability: str) -> subprocess.CompletedProcess[str]:
            return run_cli(
                *("call", capability, "--body", '{"x": 1}', "--target", a1, "--json"),
                *("--data-dir", str(b_dir)),
            )

        done = await eventually(
            lambda: asyncio.to_thread(call, "echo@1.0"),
            lambda d: d.returncode == 0,
            60,
            "a carried call",
        )
        answer = json.loads(done.stdout)
        assert ({"echo": {"x": 1}}, a1) == (answer["output"], answer["meta"]["node"])
        refused = call("echo.stream@1.0")
        assert (1, "forbidden") == (refused.returncode, json.loads(refused.stderr)["error"])
        streamed = run_cli(
            *("call", "echo.stream@1.0", "--stream", "--body", '{"count": 1}'),
            *("--target", a1, "--json", "--data-dir", str(b_dir)),
        )
        assert (2, "usage") == (streamed.returncode, json.loads(streamed.stderr)["error"])
        assert "streams are not carried" in json.loads(streamed.stderr)["message"]

        listed = await cli_async("peers", "--json", "--data-dir", str(b_dir))
        rows: list[dict[str, Any]] = json.loads(listed.stdout)["peers"]
        linked = {r["node"]: r["community"] for r in rows if r["linked"]}
        assert {a0: a0, a1: a0} == linked  # community A's id is its founder's
        assert [] == [r for r in rows if not r["linked"] and r["node"] in linked], rows
        # named from A's membership records, which B's node holds (not from a hello)
        assert [] == [r for r in rows if r["linked"] and not r["name"]], rows
    finally:
        cluster.stop_all()
        if b is not None:
            b.stop()
