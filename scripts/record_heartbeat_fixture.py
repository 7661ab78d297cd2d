"""Record real heartbeat exports of a 5-node mesh for the mesh-health tests (spec §7.5).

Five node processes on loopback join one community by invites and run with the default
5 s heartbeat. Messages are published on rotating nodes throughout, so every node writes
traces. Node 4 is killed with SIGKILL at ``--kill-at`` seconds and started again at
``--restart-at``; the run ends at ``--duration``. Each node then exports its records with
``hearthnet heartbeat export`` into ``OUT/n<i>/``, gzipped; ``OUT/events.json`` says what
happened when, so the test can check the job's verdicts against it.

Run: python -m scripts.record_heartbeat_fixture --out tests/fixtures/heartbeats_5node
(about 5 minutes; every node is stopped by PID at the end, also on failure).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hearthnet.clock import now_ms
from tests.helpers import hearthnet_cmd
from tests.integration.mesh_cluster import FAST_MESH, Cluster, wait_linked

NODES = 5
VICTIM = 4
# The cluster helper's fast timers, except the heartbeat: the job assumes the default 5 s.
ENV = {k: v for k, v in FAST_MESH.items() if k != "HEARTHNET_MESH_HEARTBEAT_S"}


async def record(
    cluster: Cluster, duration_s: float, kill_at: float, restart_at: float
) -> dict[str, object]:
    events: dict[str, object] = {"nodes": [], "victim": VICTIM}
    for i in range(NODES):
        cluster.start(i)
    await wait_linked(cluster, list(range(NODES)), NODES - 1, within_s=60)
    start = time.monotonic()
    events["start_ms"] = now_ms()
    events["nodes"] = [cluster.keys(i).node_id for i in range(NODES)]
    k = 0
    while (elapsed := time.monotonic() - start) < duration_s:
        if "killed_ms" not in events and elapsed >= kill_at:
            cluster.kill(VICTIM)
            events["killed_ms"] = now_ms()
        if "restarted_ms" not in events and elapsed >= restart_at:
            cluster.start(VICTIM)
            events["restarted_ms"] = now_ms()
        i = k % NODES
        if not (i == VICTIM and "killed_ms" in events and "restarted_ms" not in events):
            async with cluster.client(i) as c:
                await c.publish(f"fixture.t{k % 3}", "m", {"k": k})
        k += 1
        await asyncio.sleep(2)
    events["end_ms"] = now_ms()
    events["published"] = k
    return events


def export(cluster: Cluster, out: Path, since_s: float) -> None:
    """Each node's records of the last ``since_s`` seconds into ``out/n<i>``."""
    for i in range(NODES):
        target = out / f"n{i}"
        subprocess.run(  # noqa: S603 - our own CLI, fixed arguments
            hearthnet_cmd(
                "heartbeat",
                "export",
                "--data-dir",
                str(cluster.data(i)),
                "--out",
                str(target),
                "--since",
                f"{int(since_s)}s",
            ),
            check=True,
            capture_output=True,
            timeout=60,
        )
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
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="hn-fixture-") as tmp:
        cluster = Cluster(Path(tmp), env=ENV)
        try:
            events = asyncio.run(record(cluster, args.duration, args.kill_at, args.restart_at))
        finally:
            cluster.stop_all()
        export(cluster, args.out, since_s=args.duration + 600)  # the whole run, with margin
    (args.out / "events.json").write_text(json.dumps(events, indent=1) + "\n")
    print(json.dumps(events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
