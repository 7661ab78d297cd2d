"""A community of node processes in the chaos lab: one node per namespace (shared by the
chaos tests and the mesh benchmark)."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import orjson

from hearthnet.client import Client
from hearthnet.community import CommunityStore, Level
from hearthnet.identity import load_or_create_keys
from hearthnet.membership import Membership
from hearthnet.node_http import NodeHttp
from tests.chaos.netns import HostProcess, Lab, Machine


def prepare_community(root: Path, lab: Lab, name: str = "lab") -> None:
    """Every host's data dir gets keys and the same membership log (host 0 founds it),
    written offline: no invite, no bootstrap URL, nothing that tells a node where others are."""
    keys = [load_or_create_keys(root / h.name) for h in lab.hosts]
    founder = keys[0]
    view = Membership(founder.node_id)
    view.add(view.sign(founder, "community.created", founder.node_id, now_ms=1, name=name))
    for i, k in enumerate(keys[1:]):
        view.add(view.sign(founder, "member.added", k.node_id, now_ms=2 + i, level=Level.MEMBER))
    for host in lab.hosts:
        CommunityStore(root / host.name).replace(list(view.records.values()))


def start_nodes(
    root: Path, lab: Lab, env: dict[str, str], *extra: str, ready_s: float = 30
) -> list[HostProcess]:
    """`hearthnet node start` in each namespace on port 7080, zeroconf on, no peers given;
    returns once every node printed its ready line."""
    procs = [
        h.popen(
            *h.python(
                "-m",
                "hearthnet.cli",
                "node",
                "start",
                "--name",
                h.name,
                "--data-dir",
                str(root / h.name),
                "--host",
                h.ip,
                "--port",
                "7080",
                *extra,
            ),
            env={**os.environ, **env},
        )
        for h in lab.hosts
    ]
    for proc in procs:
        proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), ready_s)
    return procs


class NamespacedClient(Client):
    """A client of the machine's node, signing with its key, whose connections are made
    inside the machine's namespace: the test process reaches a home node's private
    address without starting a process there (a poll costs a request, not an interpreter)."""

    def __init__(self, root: Path, machine: Machine, port: str = "7080") -> None:
        url, keys = f"http://{machine.ip}:{port}", load_or_create_keys(root / machine.name)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(socket_factory=machine.socket_factory),
            timeout=aiohttp.ClientTimeout(total=30),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )
        super().__init__(url, keys=keys, http=NodeHttp(url, keys=keys, session=session))
        self.machine = machine
