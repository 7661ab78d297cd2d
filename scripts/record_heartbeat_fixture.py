"""Record real heartbeat exports of a 6-node mesh for the mesh-health tests (spec §7.5, §8).

Six node processes in a NAT lab (``tests/chaos/nat_lab.py``: network namespaces, real
nftables NAT; needs root and ``nft``). Nodes 0-4 have public addresses; node 0 is also a
relay and every node is its member (``--relay-url``). Node 5 is a home node behind a
symmetric NAT whose routes to nodes 1-4 are cut, so it reaches them only relayed through
node 0: its heartbeats carry ``path: relayed`` and ``via``, and the job should call it
relay-only. Nodes run with the default 5 s heartbeat. Messages are published on rotating
nodes throughout, so every node writes traces. Node 4 is killed with SIGKILL at
``--kill-at`` seconds and started again at ``--restart-at``; the run ends at
``--duration``. Each node then exports its records with ``hearthnet heartbeat export``
into ``OUT/n<i>/``, gzipped; ``OUT/events.json`` says what happened when, so the test can
check the job's verdicts against it.

Run (as root): python -m scripts.record_heartbeat_fixture --out tests/fixtures/heartbeats_6node
(about 6 minutes; the lab and every node in it are removed at the end, also on failure).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hearthnet.clock import now_ms
from tests.chaos.nat_lab import NatLab, nat_unavailable_reason
from tests.chaos.netns import REPO_ROOT, HostProcess, Machine
from tests.chaos.relay_lab import url
from tests.chaos.test_relay_netns import FAST, PORT, paths, prepare
from tests.helpers import hearthnet_cmd

PUBLIC = ("n0", "n1", "n2", "n3", "n4")
RELAY = 0
VICTIM = 4
RELAYED = 5
NODES = len(PUBLIC) + 1
# The chaos tests' fast timers, except the heartbeat: the job assumes the default 5 s.
ENV = {k: v for k, v in FAST.items() if k != "HEARTHNET_MESH_HEARTBEAT_S"}
LINKED_WITHIN_S = 120.0


def start(root: Path, machine: Machine, *extra: str) -> HostProcess:
    """``hearthnet node start`` in the machine's namespace, once it is ready."""
    proc = machine.popen(
        *machine.python(
            "-m", "hearthnet.cli", "node", "start", "--name", machine.name,
            "--data-dir", str(root / machine.name), "--host", machine.ip, "--port", PORT,
            "--no-zeroconf", *extra,
        ),
        env={**os.environ, **ENV},
    )  # fmt: skip
    proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), 60)
    return proc


def publish(root: Path, machine: Machine, topic: str) -> None:
    """One message on ``topic`` from the machine's node."""
    machine.run(
        "env", f"PYTHONPATH={REPO_ROOT}",
        *machine.python(
            "-m", "tests.chaos.relay_probe", "publish", url(machine),
            str(root / machine.name), topic, "1",
        ),
        timeout=60,
    )  # fmt: skip


def wait_linked(root: Path, machines: list[Machine], ids: list[str]) -> None:
    """Until every node links every other (node 5 relayed to all but the relay)."""
    deadline = time.monotonic() + LINKED_WITHIN_S
    while True:
        seen = [paths(root, m) for m in machines]
        if all(set(ids) - {me} <= set(got) for me, got in zip(ids, seen, strict=True)):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"not linked within {LINKED_WITHIN_S:g} s: {seen}")
        time.sleep(1)


def record(
    root: Path, lab: NatLab, duration_s: float, kill_at: float, restart_at: float
) -> dict[str, Any]:
    machines: list[Machine] = [*lab.public.values(), lab.homes[0]]
    ids = [k.node_id for k in prepare(root, machines)]
    relay = machines[RELAY]
    for public in machines[1:RELAYED]:
        lab.block(public, lab.homes[0].router)  # node 5 reaches nodes 1-4 only via node 0
    args: list[tuple[str, ...]] = [("--relay",)] + [("--relay-url", url(relay))] * (NODES - 1)
    procs = [start(root, m, *a) for m, a in zip(machines, args, strict=True)]
    try:
        wait_linked(root, machines, ids)
        events: dict[str, Any] = {
            "nodes": ids,
            "victim": VICTIM,
            "relay": RELAY,
            "relayed": RELAYED,
            "start_ms": now_ms(),
        }
        start_s = time.monotonic()
        k = 0
        while (elapsed := time.monotonic() - start_s) < duration_s:
            if "killed_ms" not in events and elapsed >= kill_at:
                machines[VICTIM].kill(procs[VICTIM], signal.SIGKILL)
                events["killed_ms"] = now_ms()
            if "restarted_ms" not in events and elapsed >= restart_at:
                procs[VICTIM] = start(root, machines[VICTIM], *args[VICTIM])
                events["restarted_ms"] = now_ms()
            i = k % NODES
            if not (i == VICTIM and "killed_ms" in events and "restarted_ms" not in events):
                publish(root, machines[i], f"fixture.t{k % 3}")
            k += 1
            time.sleep(2)
        events["end_ms"] = now_ms()
        events["published"] = k
        return events
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)


def export(root: Path, names: list[str], out: Path, since_s: float) -> None:
    """Each node's records of the last ``since_s`` seconds into ``out/n<i>``, gzipped."""
    for i, name in enumerate(names):
        target = out / f"n{i}"
        subprocess.run(  # noqa: S603 - our own CLI, fixed arguments
            hearthnet_cmd(
                "heartbeat", "export", "--data-dir", str(root / name),
                "--out", str(target), "--since", f"{int(since_s)}s",
            ),
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        for path in target.rglob("*.jsonl"):
            gz = path.with_name(path.name + ".gz")
            gz.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
            path.unlink()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--kill-at", type=float, default=90)
    p.add_argument("--restart-at", type=float, default=180)
    args = p.parse_args()
    reason = nat_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"the NAT lab cannot run here: {reason}")
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    with (
        tempfile.TemporaryDirectory(prefix="hn-fixture-") as tmp,
        NatLab(["fully-random"], public=PUBLIC) as lab,
    ):
        events = record(Path(tmp), lab, args.duration, args.kill_at, args.restart_at)
        names = [*PUBLIC, lab.homes[0].name]
        export(Path(tmp), names, args.out, since_s=args.duration + 600)  # the whole run
    (args.out / "events.json").write_text(json.dumps(events, indent=1) + "\n")
    print(json.dumps(events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
