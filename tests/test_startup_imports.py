"""What starting a node loads (spec §11: start to ready < 1 s, idle node RSS < 60 MiB)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Loaded only when a node needs them, never at start: `cryptography` (~8 MiB) reads a
# peer's certificate on the first TLS link; the CLI's client (~1.4 MiB) makes a bridge's
# first sync or a carried request.
NOT_AT_START = ("cryptography", "hearthnet.client")

# Loaded only by the paths that need them, never by a started node with no [llm] section
# and zeroconf off: jsonschema (~0.1 s to import) compiles a capability's request schema
# on its first call; llm.chat, its tool loop and backends only with [llm]; zeroconf and
# ifaddr only with [mesh] zeroconf on (or, ifaddr, a node listening on every interface);
# cbor2 (~0.7 MiB) with the first peer link, relay or CBOR client (hearthnet/cbor.py);
# statistics with the first link's heartbeats or a remote provider's call times; decimal
# with the first fractional number parsed; the relay member role's modules with the first
# relay this node attaches to.
NOT_BY_A_STARTED_NODE = (
    "cbor2",
    "statistics",
    "decimal",
    "hearthnet.mesh.relayed_paths",
    "hearthnet.mesh.relay_member",
    "hearthnet.mesh.path_switch",
    "jsonschema",
    "capabilities.llm_chat",
    "hearthnet.bus.toolloop",
    "hearthnet.bus.chatrequest",
    "hearthnet.mesh.discovery",
    "zeroconf",
    "ifaddr",
)

PROGRAM = """
import asyncio
import sys
from pathlib import Path
import hearthnet.cli, hearthnet.node
from hearthnet.config import load_config
from hearthnet.identity import load_or_create_keys
from hearthnet.mesh.tls import ensure_certificate, server_context
data = Path(sys.argv[1])
keys = load_or_create_keys(data)
server_context(*ensure_certificate(data, keys))  # made
server_context(*ensure_certificate(data, keys))  # checked and kept
hearthnet.cli.build_parser()
print(" ".join(m for m in sys.argv[2:] if m in sys.modules))

async def start() -> None:
    config = load_config(None, env={}, overrides={
        "node": {"data_dir": str(data), "host": "127.0.0.1", "port": 0},
        "mesh": {"zeroconf": False},
    })
    async with hearthnet.node.Node(config) as node:
        assert node.url
        node.mesh.traffic.messages.repair_tick()  # an anti-entropy round, with no link yet
        print(" ".join(m for m in sys.argv[2:] if m in sys.modules))

asyncio.run(start())
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Which of the watched modules a process has loaded: after importing the node and the
    CLI and making its certificate (first line), and once a node started (second)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROGRAM,
            str(tmp_path_factory.mktemp("node")),
            *NOT_AT_START,
            *NOT_BY_A_STARTED_NODE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the assert below shows stderr when it failed
    )
    lines = done.stdout.splitlines()
    assert (0, 2) == (done.returncode, len(lines)), done.stdout + done.stderr
    return lines


def test_node_start_and_its_certificate_load_no_cryptography(loaded: list[str]) -> None:
    """Importing the node and the CLI and making and checking its TLS certificate load
    neither cryptography, nor the CLI's client, nor what a started node does not load."""
    assert "" == loaded[0].strip()


def test_a_started_node_has_not_loaded_what_only_some_paths_need(loaded: list[str]) -> None:
    """A node started with no [llm] section and zeroconf off, through an anti-entropy
    round with no link, has loaded neither jsonschema, nor llm.chat and its tool loop, nor
    zeroconf (nor cryptography), nor cbor2 and the others listed."""
    assert "" == loaded[1].strip()
