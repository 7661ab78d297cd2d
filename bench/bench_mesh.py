"""Mesh benchmark (spec §7.3, §11).

1. ``loopback``: N nodes (default 20) on loopback joined by invites; messages are published
   on random nodes at a steady rate while one subscriber per node records arrival times.
   Reports publish→received-on-all-nodes p50/p99 and gossip duplicates per delivered message.
2. ``loss``: hosts in network namespaces with 10 % and then 30 % packet loss on every link
   (``--loss``); the share of messages every node holds within 15 s.
3. ``partition``: the namespaced mesh split in two, messages published on both sides, then
   healed: the time until every node holds every message.
4. ``throughput`` (``--throughput``, run alone): 3 nodes on loopback, one WebSocket
   publisher on node 0 with many publishes in flight (so the log commits, and signs, in
   batches); messages/s until both other nodes hold every message, and the CPU seconds
   each node process spent, per message per receiving node (a hop).

Needs root and iproute2 for 2 and 3 (the chaos-test harness). Every node is stopped by PID;
every loop is bounded.

Run: python -m bench.bench_mesh [--nodes 20] [--messages 200] [--skip-netns | --skip-loopback]
     [--loss 10,30]
     python -m bench.bench_mesh --throughput [--tp-messages 20000] [--in-flight 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import uvloop

from bench.common import percentile, proc_cpu_s, proc_rss_mb, save, start_node, stop_process
from hearthnet.client import Client
from hearthnet.identity import load_or_create_keys
from hearthnet.subscription import Delivery
from tests.chaos.mesh_lab import prepare_community, start_nodes
from tests.chaos.netns import Lab, unavailable_reason

FAST = {
    "HEARTHNET_MESH_DIAL_INTERVAL_S": "0.2",
    "HEARTHNET_MESH_CAPS_S": "5",
    "HEARTHNET_MESH_HEARTBEAT_S": "2",
    "HEARTHNET_NODE_LOG_LEVEL": "warning",
}


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class LoopbackMesh:
    """N node processes on loopback, one community."""

    def __init__(self, n: int, root: Path) -> None:
        self.n = n
        self.root = root
        self.procs: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []

    def _start(self, i: int, *extra: str) -> None:
        node = start_node(
            "--no-zeroconf", "--name", f"n{i}", *extra, env=FAST, data_dir=self.root / f"n{i}"
        )
        self.procs.append(node.proc)
        self.urls.append(node.url)

    def start(self) -> None:
        """Start node 0, then the others with invites from node 0."""
        self._start(0)
        for i in range(1, self.n):
            invite = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hearthnet.cli",
                    "community",
                    "invite",
                    "--data-dir",
                    str(self.root / "n0"),
                    "--bootstrap",
                    self.urls[0],
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout.strip()
            self._start(i, "--join", invite)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every node."""
        for proc in self.procs:
            proc.terminate()  # all at once: they shut down in parallel
        for proc in self.procs:
            stop_process(proc)
            if proc.stdout:
                proc.stdout.close()


async def wait_links(mesh: LoopbackMesh, at_least: int, within_s: float = 120) -> float:
    """Until every node has ``at_least`` links; returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        linked = [_metric(u, "hearthnet_peers_linked") for u in mesh.urls]
        if min(linked) >= at_least:
            return time.monotonic() - start
        await asyncio.sleep(0.5)
    raise RuntimeError(f"links never reached {at_least}")


async def loopback(n: int, messages: int, rate: float) -> dict[str, Any]:
    """Propagation latency to all nodes, and duplicates, in an N-node loopback mesh."""
    root = Path(tempfile.mkdtemp(prefix="hn-mesh-"))
    mesh = LoopbackMesh(n, root)
    started = time.monotonic()
    try:
        mesh.start()
        link_s = await wait_links(mesh, min(3, n - 1))
        ready_s = time.monotonic() - started  # all started, joined, and linked
        arrivals: dict[str, dict[int, float]] = {}
        sent: dict[str, float] = {}
        clients = [
            Client(u, keys=load_or_create_keys(root / f"n{i}")) for i, u in enumerate(mesh.urls)
        ]
        subs = [c.subscribe("bench.mesh.*") for c in clients]
        for s in subs:
            await s.__aenter__()

        async def listen(i: int) -> None:
            async for item in subs[i]:
                if isinstance(item, Delivery):
                    arrivals.setdefault(item.id, {})[i] = time.perf_counter()

        listeners = [asyncio.get_running_loop().create_task(listen(i)) for i in range(n)]
        await asyncio.sleep(1.0)
        dup_before = sum(_metric(u, "hearthnet_gossip_duplicates_total") for u in mesh.urls)
        rng = random.Random(7)
        for k in range(messages):
            i = rng.randrange(n)
            t0 = time.perf_counter()
            ack = await clients[i].publish(f"bench.mesh.t{k % 10}", "m", {"k": k})
            sent[ack["id"]] = t0
            await asyncio.sleep(1 / rate)
        deadline = time.monotonic() + 30
        # Polls the arrival table (bounded by the deadline) rather than wiring an event per message.
        while time.monotonic() < deadline and any(len(arrivals.get(m, {})) < n for m in sent):  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        for task in listeners:
            task.cancel()
        for s in subs:
            await s.close()
        for c in clients:
            await c.close()
        dup_after = sum(_metric(u, "hearthnet_gossip_duplicates_total") for u in mesh.urls)
        to_all = [
            max(arrivals[m].values()) - t0
            for m, t0 in sent.items()
            if len(arrivals.get(m, {})) == n
        ]
        rss = [proc_rss_mb(proc.pid) for proc in mesh.procs]
        return {
            "nodes": n,
            "messages": messages,
            "rate_per_s": rate,
            "start_join_link_s": round(ready_s, 1),
            "links_after_start_s": round(link_s, 1),
            "delivered_to_all": len(to_all),
            "to_all_p50_ms": round(percentile(to_all, 50) * 1000, 1),
            "to_all_p99_ms": round(percentile(to_all, 99) * 1000, 1),
            "to_all_max_ms": round(max(to_all) * 1000, 1) if to_all else None,
            "duplicates_per_delivery": round(
                (dup_after - dup_before) / max(1, messages * (n - 1)), 3
            ),
            "node_rss_mb_mean": round(sum(rss) / len(rss), 1),
        }
    finally:
        mesh.stop()


async def _held(client: Client, prefix: str) -> int:
    """How many messages of the topics under ``prefix`` the client's node holds."""
    rows = await client.topics(prefix=prefix, limit=1000)
    return sum(int(t["messages"]) for t in rows)


async def throughput(messages: int, in_flight: int, within_s: float = 120) -> dict[str, Any]:
    """Messages/s from one publisher through a 3-node mesh, and CPU per message per hop."""
    root = Path(tempfile.mkdtemp(prefix="hn-mesh-tp-"))
    mesh = LoopbackMesh(3, root)
    prefix = "bench.tp."  # 50 topics: retention keeps 1,000 messages per topic
    payload = {"text": "x" * 200}  # ~256 bytes of data, a token-stream-sized message
    try:
        mesh.start()
        await wait_links(mesh, 2)
        await asyncio.sleep(2.0)  # the greeting frames settle
        client, *watchers = (
            Client(u, keys=load_or_create_keys(root / f"n{i}")) for i, u in enumerate(mesh.urls)
        )
        cpu0 = [proc_cpu_s(p.pid) for p in mesh.procs]
        start = time.perf_counter()
        async with client.publisher() as pub:
            slots = asyncio.Semaphore(in_flight)

            async def one(k: int) -> None:
                async with slots:
                    await pub.publish(f"{prefix}{k % 50}", "m", {**payload, "k": k})

            await asyncio.gather(*(one(k) for k in range(messages)))
        published_s = time.perf_counter() - start
        await client.close()
        deadline = time.monotonic() + within_s
        held = [0, 0]
        while time.monotonic() < deadline:
            held = [await _held(w, prefix) for w in watchers]
            if min(held) >= messages:
                break
            await asyncio.sleep(0.1)
        all_held_s = time.perf_counter() - start
        for w in watchers:
            await w.close()
        cpu = [proc_cpu_s(p.pid) - c for p, c in zip(mesh.procs, cpu0, strict=True)]
        dups = sum(_metric(u, "hearthnet_gossip_duplicates_total") for u in mesh.urls)
        return {
            "nodes": 3,
            "messages": messages,
            "in_flight": in_flight,
            "held_by_all": min(held) >= messages,
            "publish_s": round(published_s, 2),
            "all_held_s": round(all_held_s, 2),
            "messages_per_s": round(messages / all_held_s),
            "origin_cpu_us_per_msg": round(cpu[0] / messages * 1e6, 1),
            "receiver_cpu_us_per_msg_per_hop": round(sum(cpu[1:]) / (2 * messages) * 1e6, 1),
            "duplicates_per_msg": round(dups / messages, 2),
        }
    finally:
        mesh.stop()


def netns(hosts: int, messages: int, loss_pcts: list[int]) -> dict[str, Any]:
    """Loss and partition runs in network namespaces (the chaos-test lab)."""
    reason = unavailable_reason()
    if reason is not None:
        return {"skipped": reason}
    root = Path(tempfile.mkdtemp(prefix="hn-mesh-ns-"))
    result: dict[str, Any] = {"hosts": hosts}
    with Lab(hosts) as lab:
        prepare_community(root, lab, "bench")
        env = {**FAST, "HEARTHNET_MESH_ANTI_ENTROPY_S": "2", "HEARTHNET_PUBSUB_SYNC": "normal"}
        procs = start_nodes(root, lab, env, "--log-level", "warning", ready_s=60)

        def cli(h: Any, *args: str) -> str:
            return str(
                h.run(
                    *h.python("-m", "hearthnet.cli", *args, "--data-dir", str(root / h.name)),
                    timeout=60,
                ).stdout
            )

        def counts(topic: str) -> list[int]:
            out = []
            for h in lab.hosts:
                topics = json.loads(cli(h, "topics", "--json", "--prefix", topic))["topics"]
                out.append(sum(t["messages"] for t in topics if t["topic"] == topic))
            return out

        def until(topic: str, want: int, within_s: float) -> float | None:
            start = time.monotonic()
            while time.monotonic() - start < within_s:
                if min(counts(topic)) >= want:
                    return time.monotonic() - start
                time.sleep(0.5)
            return None

        time.sleep(8)  # zeroconf + links
        result["loss"] = []
        for pct in loss_pcts:
            topic = f"bench.loss{pct}"
            lab.netem_all(loss_pct=pct)
            start = time.monotonic()
            for k in range(messages):
                cli(lab.hosts[k % hosts], "pub", topic, "--data", f'{{"k": {k}}}')
            publish_s = time.monotonic() - start
            converged = until(topic, messages, 15)
            final = counts(topic)
            result["loss"].append(
                {
                    "loss_pct": pct,
                    "messages": messages,
                    "publish_s": round(publish_s, 1),
                    "all_held_within_15s": converged is not None,
                    "share_held_at_15s": round(
                        sum(min(c, messages) for c in final) / (messages * hosts), 4
                    ),
                    "seconds_after_last_publish": (
                        round(converged, 1) if converged is not None else None
                    ),
                }
            )
        # the partition runs with the first loss level on, as it always has
        lab.netem_all(loss_pct=loss_pcts[0] if loss_pcts else 0)
        half = hosts // 2
        lab.partition(lab.hosts[:half], lab.hosts[half:])
        for k in range(messages):
            side = lab.hosts[:half] if k % 2 else lab.hosts[half:]
            cli(side[k % len(side)], "pub", "bench.split", "--data", f'{{"k": {k}}}')
        lab.heal_all()
        healed = until("bench.split", messages, 60)
        result["partition"] = {
            "messages": messages,
            "converged_s_after_heal": round(healed, 1) if healed else None,
        }
        for p in procs:
            p.stop()
    return result


def main() -> None:
    """Run and save bench/results/mesh.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument(
        "--rate", type=float, default=10.0, help="publishes per second (loopback run)"
    )
    parser.add_argument(
        "--hosts", type=int, default=6, help="namespaced hosts (loss and partition runs)"
    )
    parser.add_argument("--ns-messages", type=int, default=50)
    parser.add_argument(
        "--loss",
        type=lambda v: [int(p) for p in v.split(",")],
        default=[10, 30],
        help="loss percentages on every link, one run each (default 10,30)",
    )
    parser.add_argument("--skip-netns", action="store_true")
    parser.add_argument("--skip-loopback", action="store_true", help="only the netns runs")
    parser.add_argument("--throughput", action="store_true", help="only the 3-node throughput run")
    parser.add_argument("--tp-messages", type=int, default=20_000, help="at most 50,000")
    parser.add_argument("--in-flight", type=int, default=256)
    args = parser.parse_args()
    if args.throughput:
        tp = uvloop.run(throughput(args.tp_messages, args.in_flight))
        save("mesh_throughput", tp)
        return
    result: dict[str, Any] = {}
    if not args.skip_loopback:
        result["loopback"] = uvloop.run(loopback(args.nodes, args.messages, args.rate))
    if not args.skip_netns:
        result["netns"] = netns(args.hosts, args.ns_messages, args.loss)
    save("mesh", result)


if __name__ == "__main__":
    main()
