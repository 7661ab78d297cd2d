"""Shared steps of the relay scenarios in the NAT lab: nodes started together, the client
probe run in a namespace, a metric read from a node."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearthnet.identity import KeyPair
from tests.chaos.nat_lab import HomeHost, NatLab, PublicHost
from tests.chaos.netns import REPO_ROOT, HostProcess, Machine
from tests.chaos.test_relay_netns import FAST, PORT

READY_S = 60.0  # every node of a scenario starts at once on a loaded 2-core machine


def start_all(root: Path, nodes: list[tuple[Machine, tuple[str, ...]]]) -> list[HostProcess]:
    """``hearthnet node start`` for every ``(machine, extra args)`` at once; returned when
    all are ready (the caller stops them)."""
    procs = [launch(root, machine, *extra) for machine, extra in nodes]
    for proc in procs:
        proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), READY_S)
    return procs


def launch(
    root: Path, machine: Machine, *extra: str, name: str | None = None, port: str = PORT
) -> HostProcess:
    """``hearthnet node start`` in the machine's namespace, not waited for (``name``: a
    second node on the machine, with that name and data dir, on another ``port``)."""
    name = name or machine.name
    return machine.popen(
        *machine.python(
            "-m", "hearthnet.cli", "node", "start", "--name", name,
            "--data-dir", str(root / name), "--host", machine.ip, "--port", port,
            "--no-zeroconf", *extra,
        ),
        env={**os.environ, **FAST},
    )  # fmt: skip


def url(machine: Machine) -> str:
    """The node's URL on its own address."""
    return f"http://{machine.ip}:{PORT}"


def probe(root: Path, machine: Machine, *args: str, timeout: float = 120) -> Any:
    """``tests.chaos.relay_probe ARGS`` against the machine's node, in its namespace."""
    done = machine.run(
        "env", f"PYTHONPATH={REPO_ROOT}",
        *machine.python(
            "-m", "tests.chaos.relay_probe", args[0], url(machine), str(root / machine.name),
            *args[1:],
        ),
        timeout=timeout,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def metric(machine: Machine, prefix: str) -> float:
    """The sum of the node's ``/metrics`` samples whose line starts with ``prefix``."""
    done = machine.run("curl", "-s", f"{url(machine)}/metrics", timeout=30)
    return sum(
        float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith(prefix)
    )


def stop_all(procs: list[HostProcess]) -> None:
    """SIGTERM whatever still runs, last started first."""
    for proc in reversed(procs):
        if proc.returncode is None:
            proc.host.kill(proc, 15)


@dataclass
class RelayPair:
    """A NAT lab with one relay and two homes: the lab, the data root, the relay and homes
    A and B, and the three nodes' keys."""

    lab: NatLab
    root: Path
    relay: PublicHost
    a: HomeHost
    b: HomeHost
    keys: list[KeyPair]
