"""Relay benchmark (spec §8, §11): the relayed path against the direct link, in one run.

1. ``direct``: a relay R1 and two members A, B that dial each other (a direct link).
2. ``relayed``: A and B are stopped; A', B' advertise an address nobody can dial and are
   given relays R1 and R2 (``--relay-url`` twice), so A' reaches B' only relayed. R2
   starts after both attached to R1 (relays do not federate yet: members of different
   relays could not reach each other), and is the one they fail over to.

On each pair: (a) signed ``echo@1.0`` calls A→B pinned with ``X-HearthNet-Target``, at
concurrency 1 and 16 (p50/p99, calls/s); (b) publishes on A delivered to N subscribers
on B (deliveries/s). Then (c) the relay's CPU per forwarded frame: its process CPU from
/proc over the route frames it forwarded (``hearthnet_relay_forwarded_frames``), its idle
CPU subtracted, beside the in-process cost of the relay core's per-frame path (route
header, core, the bytes passed on); and (d) failover: the relay in use is killed with -9
and the time until a call, and a publish, from A' reach B' again. Ratios relayed/direct
are from this run.

Every node is started on loopback and stopped by PID; every loop is bounded by count and
time.

``--cpu-only`` starts R1, A' and B' only and measures (c) at ``--concurrency`` calls in
flight (16), with the route frames per WebSocket message R1 read from the members and
queued to them (route batches on ``hearthnet-peer.v4`` links); ``--one-at-a-time`` adds
the same at one call at a time, traffic with little to batch. The in-process costs are
CPU time (``time.process_time``): the relay's path for a frame alone and for frames in
route batches of 8.

``--latency`` instead keeps a direct pair and a relayed pair up at once and measures them
in alternate rounds (calls at concurrency 1 and 16, fan-out), recording the load average;
``--member-budget`` sets the relay's per-member budget, so members pace themselves.

Run: python -m bench.bench_relay [--quick] [--calls 2000] [--subscribers 10]
     python -m bench.bench_relay --cpu-only [--concurrency 16] [--one-at-a-time]
     python -m bench.bench_relay --latency [--repeat 6] [--no-fanout] [--member-budget B]
         [--spy DIR]   (py-spy profiles of the calls at 16: bench/spy.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import uvloop

from bench.common import NodeUnderTest, proc_cpu_s, save, start_node, summarize_latencies
from bench.servers import free_port
from bench.spy import Spy
from hearthnet.client import Client
from hearthnet.errors import HearthNetError
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.mesh.relay_core import RelayConfig, RelayCore
from hearthnet.mesh.relay_frames import Attach, Route
from hearthnet.mesh.route_header import encode_route, passed_on, read_header
from hearthnet.subscription import Delivery

UNDIALLABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there
# --spy: the shares of samples in the relayed path's own code and in the links' writes
SPY_GROUPS = {
    "relayed_path": (
        *("mesh/paths.py", "mesh/pathseq.py", "mesh/path_", "mesh/relay_member.py"),
        *("mesh/relay_e2e.py", "mesh/relayed_paths.py", "mesh/relay_core.py"),
        *("mesh/relay_role", "mesh/relaying.py", "mesh/route_"),
    ),
    "socket_writes": ("mesh/wsbatch.py",),
    "signatures": ("bus/signatures.py", "identity.py"),
}
FAST = {
    "HEARTHNET_MESH_DIAL_INTERVAL_S": "0.2",
    "HEARTHNET_MESH_CAPS_S": "1",
    "HEARTHNET_MESH_HEARTBEAT_S": "1",
    "HEARTHNET_MESH_PRESENCE_REFRESH_S": "1",
    "HEARTHNET_PUBSUB_SYNC": "normal",
    "HEARTHNET_NODE_LOG_LEVEL": "warning",
    "HEARTHNET_LIMITS_CALLS_PER_S_PER_CAPABILITY": "100000",  # the load is one caller
    "HEARTHNET_LIMITS_CALLS_PER_S_TOTAL": "100000",
    # the path's capacity, not the member budget (256 KiB/s by default, spec §8), is measured
    "HEARTHNET_MESH_RELAY_MEMBER_BYTES_PER_S": str(64 << 20),
    "HEARTHNET_MESH_RELAY_CAPACITY_BYTES_PER_S": str(256 << 20),
    # on loopback nothing filters, so a punch always succeeds: the relayed path is measured
    "HEARTHNET_MESH_DIRECT_UPGRADE": "false",
}


def metric(url: str, name: str) -> float:
    """One metric of a node's /metrics (0 when absent); ``name`` may carry its labels,
    ``name{label="value"}``, as the node writes them."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


ROUTE_MESSAGES_IN = 'hearthnet_relay_route_messages{direction="in"}'
ROUTE_MESSAGES_OUT = 'hearthnet_relay_route_messages{direction="out"}'


def cli(*args: str) -> str:
    """Run ``hearthnet`` with ``args``; its stdout."""
    return subprocess.run(
        [sys.executable, "-m", "hearthnet.cli", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()


def peer_paths(data_dir: Path) -> dict[str, tuple[str, str | None]]:
    """``{peer: (path, via)}`` of a node's linked peers that answered a ping."""
    peers = json.loads(cli("peers", "--json", "--data-dir", str(data_dir)))["peers"]
    return {
        p["node"]: (p["path"], p["via"])
        for p in peers
        if p["linked"] and p["rtt_ms_p50"] is not None
    }


class Nodes:
    """The node processes of one run, each stopped by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: dict[str, NodeUnderTest] = {}

    def data(self, name: str) -> Path:
        """The data dir of ``name``."""
        return self.root / name

    def node_id(self, name: str) -> str:
        """The NodeID of ``name``."""
        return load_or_create_keys(self.data(name)).node_id

    def start(self, name: str, *extra: str) -> NodeUnderTest:
        """Start node ``name`` on a free loopback port."""
        node = start_node(
            "--no-zeroconf", "--name", name, *extra, env=FAST, data_dir=self.data(name)
        )
        self.nodes[name] = node
        return node

    def join(self, name: str, *extra: str) -> NodeUnderTest:
        """Start ``name`` with an invite from R1."""
        invite = cli(
            "community", "invite", "--data-dir", str(self.data("r1")),
            "--bootstrap", self.nodes["r1"].url,
        )  # fmt: skip
        return self.start(name, "--join", invite, *extra)

    def stop(self, name: str) -> None:
        """SIGTERM (then SIGKILL) one node."""
        node = self.nodes.pop(name)
        node.stop()
        if node.proc.stdout:
            node.proc.stdout.close()

    def kill(self, name: str) -> None:
        """kill -9 one node."""
        node = self.nodes.pop(name)
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)
        if node.proc.stdout:
            node.proc.stdout.close()

    def stop_all(self) -> None:
        """Every node still running."""
        for node in self.nodes.values():
            node.proc.terminate()  # all at once: they shut down in parallel
        for name in list(self.nodes):
            self.stop(name)


async def wait_path(
    nodes: Nodes, a: str, b: str, path: str, within_s: float = 60
) -> tuple[str, str | None]:
    """Until ``a`` sees ``b`` on ``path`` (answered a ping); ``(path, via)``."""
    peer = nodes.node_id(b)
    deadline = time.monotonic() + within_s
    seen: dict[str, tuple[str, str | None]] = {}
    while time.monotonic() < deadline:
        seen = await asyncio.to_thread(peer_paths, nodes.data(a))
        got = seen.get(peer)
        if got is not None and got[0] == path:
            return got
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{a} never saw {b} {path}: {seen}")


async def calls(client: Client, target: str, count: int, concurrency: int) -> dict[str, Any]:
    """``count`` signed echo calls pinned to ``target``, ``concurrency`` at a time."""
    samples: list[float] = []
    left = count
    errors = 0

    async def worker() -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            try:
                await client.call_with_meta("echo@1.0", {"x": 1}, target=target)
            except HearthNetError:
                errors += 1
                continue
            samples.append(time.perf_counter() - t0)

    for _ in range(min(20, count)):  # warm up the path and the client's caches
        await client.call_with_meta("echo@1.0", {"x": 0}, target=target)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return {
        **summarize_latencies(samples),
        "errors": errors,
        "calls_per_s": round(len(samples) / wall, 1),
    }


async def fanout(
    pub: Client, sub: Client, topic: str, messages: int, subscribers: int
) -> dict[str, Any]:
    """Publishes on ``pub``'s node delivered to ``subscribers`` subscriptions on ``sub``'s."""
    want = messages * subscribers
    got = 0
    last = 0.0
    done = asyncio.Event()
    subs = [sub.subscribe(topic) for _ in range(subscribers)]
    for s in subs:
        await s.__aenter__()

    async def listen(s: Any) -> None:
        nonlocal got, last
        async for item in s:
            if isinstance(item, Delivery):
                got += 1
                last = time.perf_counter()
                if got >= want:
                    done.set()

    tasks = [asyncio.get_running_loop().create_task(listen(s)) for s in subs]
    await asyncio.sleep(1.0)  # the subscriptions are live
    left = messages

    async def publisher() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await pub.publish(topic, "m", {"k": left, "pad": "x" * 64})

    start = time.perf_counter()
    await asyncio.gather(*(publisher() for _ in range(8)))
    published = time.perf_counter() - start
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), 30)
    for t in tasks:
        t.cancel()
    for s in subs:
        await s.close()
    wall = (last or time.perf_counter()) - start
    return {
        "messages": messages,
        "subscribers": subscribers,
        "delivered": got,
        "publishes_per_s": round(messages / published, 1),
        "deliveries_per_s": round(got / wall, 1),
    }


async def pair(opts: argparse.Namespace, a: Client, target: str) -> dict[str, Any]:
    """Calls at concurrency 1 and 16 on one pair."""
    return {
        "c1": await calls(a, target, opts.calls // 4, 1),
        "c16": await calls(a, target, opts.calls, 16),
    }


def core_frame_us(repeat: int) -> dict[str, Any]:
    """The relay's per-frame path in-process: the binary route header read, the core's
    decision, and the forwarded frame's bytes (the received ones with ``ttl_hops``
    patched); the end-to-end frame behind the header is never decoded."""
    a, b = KeyPair.generate().node_id, KeyPair.generate().node_id
    unbounded = RelayConfig(member_bytes_per_s=1 << 40, capacity_bytes_per_s=1 << 40)
    core = RelayCore("relay", lambda _n: True, unbounded)
    for link, node in (("la", a), ("lb", b)):
        core.link_up(link, node, "127.0.0.1:1", 0.0)
        core.receive(link, Attach(), 0.0)
    raws = [encode_route(Route(b, a, 4, i, b"s" * 300)) for i in range(repeat)]
    start = time.process_time()  # CPU time: the machine is shared
    for i, raw in enumerate(raws):
        head = read_header(raw)
        for _action in core.route("la", head, i * 1e-6):
            passed_on(raw, head)
    total = time.process_time() - start
    return {
        "frames": repeat,
        "forwarded": core.statistics().forwarded,
        "us_per_frame": round(total / repeat * 1e6, 2),
    }


def core_batch_us(repeat: int, per_batch: int = 8) -> dict[str, Any] | None:
    """The relay's per-frame path for frames that come in route batches of ``per_batch``
    (spec §11, a v4 link): the batch's headers read, the core's decision (per run of
    frames between the same two nodes), and the batch written on as one message with each
    ``ttl_hops`` patched. None on a build from before route batches, or from before they
    were decided a run at a time (the bench is run against one to compare)."""
    try:
        from hearthnet.mesh import route_batch  # noqa: PLC0415 (absent before v4)
    except ImportError:
        return None
    if not hasattr(route_batch, "batch_runs"):  # batches decided frame by frame
        return None
    a, b = KeyPair.generate().node_id, KeyPair.generate().node_id
    unbounded = RelayConfig(member_bytes_per_s=1 << 40, capacity_bytes_per_s=1 << 40)
    core = RelayCore("relay", lambda _n: True, unbounded)
    for link, node in (("la", a), ("lb", b)):
        core.link_up(link, node, "127.0.0.1:1", 0.0)
        core.receive(link, Attach(), 0.0)
    raws = [encode_route(Route(b, a, 4, i, b"s" * 300)) for i in range(repeat)]
    batches = [
        route_batch.encode_batch(raws[i : i + per_batch]) for i in range(0, repeat, per_batch)
    ]
    start = time.process_time()
    for i, batch in enumerate(batches):
        runs = route_batch.batch_runs(batch)
        decided, _ = core.route_runs("la", runs, i * 1e-5)
        picks = [(run, None) for run, (t, _each) in zip(runs, decided, strict=True) if t]
        route_batch.passed_on_runs(batch, picks, whole=len(picks) == len(runs))
    total = time.process_time() - start
    return {
        "frames": repeat,
        "per_batch": per_batch,
        "forwarded": core.statistics().forwarded,
        "us_per_frame": round(total / repeat * 1e6, 2),
    }


def proc_syscalls(pid: int) -> tuple[int, int]:
    """``(syscr, syscw)`` of a process: its read and write system calls so far."""
    fields = dict(line.split(": ", 1) for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


async def relay_cpu(
    nodes: Nodes, relay: str, a: Client, target: str, count: int, concurrency: int = 16
) -> dict[str, Any]:
    """The relay process's CPU per forwarded frame over ``count`` relayed calls,
    ``concurrency`` at a time, and the route frames per WebSocket message it read and
    queued (route batches on v4 links: a node before them reads 0 messages, so 0)."""
    node = nodes.nodes[relay]
    c0, t0 = proc_cpu_s(node.pid), time.monotonic()
    await asyncio.sleep(3)
    idle_per_s = (proc_cpu_s(node.pid) - c0) / (time.monotonic() - t0)
    f0 = metric(node.url, "hearthnet_relay_forwarded_frames")
    m0 = metric(node.url, ROUTE_MESSAGES_IN), metric(node.url, ROUTE_MESSAGES_OUT)
    io0 = proc_syscalls(node.pid)
    c0, t0 = proc_cpu_s(node.pid), time.monotonic()
    done = await calls(a, target, count, concurrency)
    cpu, wall = proc_cpu_s(node.pid) - c0, time.monotonic() - t0
    io1 = proc_syscalls(node.pid)
    frames = metric(node.url, "hearthnet_relay_forwarded_frames") - f0
    m_in = metric(node.url, ROUTE_MESSAGES_IN) - m0[0]
    m_out = metric(node.url, ROUTE_MESSAGES_OUT) - m0[1]
    busy = max(0.0, cpu - idle_per_s * wall)
    return {
        "concurrency": concurrency,
        "calls_per_s": done["calls_per_s"],
        "forwarded_frames": int(frames),
        # route frames per WebSocket message read from the members, and queued to them
        "frames_per_message_in": round(frames / m_in, 2) if m_in else None,
        "frames_per_message_out": round(frames / m_out, 2) if m_out else None,
        # read/write system calls (sockets included) per forwarded frame, from /proc/PID/io
        "reads_per_frame": round((io1[0] - io0[0]) / max(1, frames), 3),
        "writes_per_frame": round((io1[1] - io0[1]) / max(1, frames), 3),
        "relay_cpu_s": round(cpu, 3),
        "relay_idle_cpu_per_s": round(idle_per_s, 4),
        "us_per_frame": round(cpu / max(1, frames) * 1e6, 1),
        "us_per_frame_less_idle": round(busy / max(1, frames) * 1e6, 1),
    }


async def failover(
    nodes: Nodes, relays: tuple[str, ...], a: Client, b: Client, target: str
) -> dict[str, Any]:
    """kill -9 the relay in use: seconds until a call, and a publish, get through again."""
    got = asyncio.Event()
    sub = b.subscribe("bench.relay.failover")
    await sub.__aenter__()

    async def listen() -> None:
        async for item in sub:
            if isinstance(item, Delivery) and item.data.get("after"):
                got.set()

    task = asyncio.get_running_loop().create_task(listen())
    await asyncio.sleep(1.0)
    via = (await wait_path(nodes, "a2", "b2", "relayed"))[1]
    relay = next(n for n in relays if nodes.node_id(n) == via)  # the one in use now
    nodes.kill(relay)
    killed = time.monotonic()
    call_s = publish_s = None
    tries = 0
    while time.monotonic() - killed < 30 and (call_s is None or publish_s is None):
        if publish_s is None:
            if got.is_set():
                publish_s = time.monotonic() - killed
            else:
                with contextlib.suppress(HearthNetError, TimeoutError, OSError):
                    await asyncio.wait_for(
                        a.publish("bench.relay.failover", "m", {"after": True}), 2
                    )
        if call_s is None:
            tries += 1
            try:
                await asyncio.wait_for(
                    a.call_with_meta("echo@1.0", {"x": 2}, target=target, deadline_ms=1000), 2
                )
                call_s = time.monotonic() - killed
            except (HearthNetError, TimeoutError, OSError):
                await asyncio.sleep(0.05)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got.wait(), 0.1)
    task.cancel()
    await sub.close()
    return {
        "killed": relay,
        "call_back_s": round(call_s, 2) if call_s is not None else None,
        "publish_delivered_s": round(publish_s, 2) if publish_s is not None else None,
        "call_tries": tries,
    }


def ratios(direct: dict[str, Any], relayed: dict[str, Any]) -> dict[str, Any]:
    """relayed/direct for the numbers spec §11 bounds."""
    out: dict[str, Any] = {}
    for c in ("c1", "c16"):
        out[f"{c}_p50_added_ms"] = round(relayed[c]["p50_ms"] - direct[c]["p50_ms"], 3)
        out[f"{c}_calls_per_s_ratio"] = round(
            relayed[c]["calls_per_s"] / direct[c]["calls_per_s"], 3
        )
    out["fanout_ratio"] = round(
        relayed["fanout"]["deliveries_per_s"] / direct["fanout"]["deliveries_per_s"], 3
    )
    return out


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Both phases, the relay's CPU and failover; the result."""
    root = Path(tempfile.mkdtemp(prefix="hn-relay-"))
    nodes = Nodes(root)
    result: dict[str, Any] = {"options": vars(opts)}
    try:
        nodes.start("r1", "--relay")
        # R2 is started only after A' and B' attached to R1: with no federation between
        # relays yet, members attached to different relays would not reach each other
        r2_port = free_port()
        relays = (
            "--relay-url",
            nodes.nodes["r1"].url,
            "--relay-url",
            f"http://127.0.0.1:{r2_port}",
        )
        if opts.cpu_only:
            return await cpu_only(opts, nodes, relays)
        # 1. direct
        nodes.join("a")
        nodes.join("b")
        result["direct_path"] = await wait_path(nodes, "a", "b", "direct")
        async with (
            Client(nodes.nodes["a"].url, keys=load_or_create_keys(nodes.data("a"))) as a,
            Client(nodes.nodes["b"].url, keys=load_or_create_keys(nodes.data("b"))) as b,
        ):
            direct = [await pair(opts, a, nodes.node_id("b")) for _ in range(opts.repeat)]
            fans = [
                await fanout(a, b, f"bench.relay.d{i}", opts.messages, opts.subscribers)
                for i in range(opts.repeat)
            ]
        nodes.stop("a")
        nodes.stop("b")
        # 2. relayed
        nodes.join("a2", *relays, "--advertise-url", UNDIALLABLE)
        nodes.join("b2", *relays, "--advertise-url", UNDIALLABLE)
        path = await wait_path(nodes, "a2", "b2", "relayed")
        result["relayed_path"] = path
        via = "r1"
        assert path[1] == nodes.node_id("r1")
        target = nodes.node_id("b2")
        async with (
            Client(nodes.nodes["a2"].url, keys=load_or_create_keys(nodes.data("a2"))) as a2,
            Client(nodes.nodes["b2"].url, keys=load_or_create_keys(nodes.data("b2"))) as b2,
        ):
            relayed = [await pair(opts, a2, target) for _ in range(opts.repeat)]
            rfans = [
                await fanout(a2, b2, f"bench.relay.r{i}", opts.messages, opts.subscribers)
                for i in range(opts.repeat)
            ]
            cpu = [
                await relay_cpu(nodes, via, a2, target, 2 * opts.calls) for _ in range(opts.repeat)
            ]
            nodes.join("r2", "--relay", "--port", str(r2_port))
            for member in ("a2", "b2"):
                await wait_path(nodes, member, "r2", "direct")
            result["failover"] = await failover(nodes, ("r1", "r2"), a2, b2, target)
        for d, f in zip(direct, fans, strict=True):
            d["fanout"] = f
        for r, f in zip(relayed, rfans, strict=True):
            r["fanout"] = f
        result["direct"] = direct
        result["relayed"] = relayed
        result["ratios"] = [ratios(d, r) for d, r in zip(direct, relayed, strict=True)]
        result["relay_cpu"] = cpu
        result["core_frame"] = [core_frame_us(opts.core_frames) for _ in range(opts.repeat)]
    finally:
        nodes.stop_all()
    return result


async def latency(opts: argparse.Namespace) -> dict[str, Any]:
    """``--latency``: a direct pair (A, B) and a relayed pair (A', B', through R1) up at
    once, measured in alternate rounds (direct first in even rounds, relayed first in odd
    ones) so both see the same machine; the load average is recorded with each round."""
    root = Path(tempfile.mkdtemp(prefix="hn-relay-lat-"))
    nodes = Nodes(root)
    rounds: list[dict[str, Any]] = []
    try:
        nodes.start("r1", "--relay")
        nodes.join("a")
        nodes.join("b")
        relayed_args = ("--relay-url", nodes.nodes["r1"].url, "--advertise-url", UNDIALLABLE)
        nodes.join("a2", *relayed_args)
        nodes.join("b2", *relayed_args)
        paths = {
            "direct": await wait_path(nodes, "a", "b", "direct"),
            "relayed": await wait_path(nodes, "a2", "b2", "relayed"),
        }
        assert paths["relayed"][1] == nodes.node_id("r1")
        pairs = {"direct": ("a", "b"), "relayed": ("a2", "b2")}
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                name: await stack.enter_async_context(
                    Client(nodes.nodes[name].url, keys=load_or_create_keys(nodes.data(name)))
                )
                for name in ("a", "b", "a2", "b2")
            }
            for i in range(opts.repeat):
                order = ("direct", "relayed") if i % 2 == 0 else ("relayed", "direct")
                row: dict[str, Any] = {"order": order}
                for kind in order:
                    src, dst = pairs[kind]
                    target = nodes.node_id(dst)
                    m: dict[str, Any] = {"load_before": os.getloadavg()[0]}
                    m["c1"] = await calls(clients[src], target, opts.calls // 4, 1)
                    spy = None
                    if opts.spy is not None:  # the pair's processes (and the relay's)
                        names = (src, dst, "r1") if kind == "relayed" else (src, dst)
                        pids = {n: nodes.nodes[n].pid for n in names}
                        spy = Spy(Path(opts.spy) / f"{i}-{kind}", pids)
                    m["c16"] = await calls(clients[src], target, opts.calls, 16)
                    if spy is not None:
                        m["c16"]["spy"] = spy.stop(SPY_GROUPS)
                    if not opts.no_fanout:
                        m["fanout"] = await fanout(
                            clients[src], clients[dst], f"bench.lat.{kind}{i}",
                            opts.messages, opts.subscribers,
                        )  # fmt: skip
                    m["load_after"] = os.getloadavg()[0]
                    row[kind] = m
                rounds.append(row)
    finally:
        nodes.stop_all()
    out: list[dict[str, Any]] = []
    for row in rounds:
        d, r = row["direct"], row["relayed"]
        ratio = {
            f"{c}_{q}_added_ms": round(r[c][f"{q}_ms"] - d[c][f"{q}_ms"], 3)
            for c in ("c1", "c16")
            for q in ("p50", "p99")
        }
        ratio["c16_calls_per_s_ratio"] = round(r["c16"]["calls_per_s"] / d["c16"]["calls_per_s"], 3)
        if "fanout" in d:
            ratio["fanout_ratio"] = round(
                r["fanout"]["deliveries_per_s"] / d["fanout"]["deliveries_per_s"], 3
            )
        out.append(ratio)
    return {"options": vars(opts), "paths": paths, "rounds": rounds, "ratios": out}


async def cpu_only(
    opts: argparse.Namespace, nodes: Nodes, relays: tuple[str, ...]
) -> dict[str, Any]:
    """Only the relayed pair and the relay's CPU per forwarded frame (``--cpu-only``)."""
    nodes.join("a2", *relays, "--advertise-url", UNDIALLABLE)
    nodes.join("b2", *relays, "--advertise-url", UNDIALLABLE)
    await wait_path(nodes, "a2", "b2", "relayed")
    target = nodes.node_id("b2")
    async with Client(nodes.nodes["a2"].url, keys=load_or_create_keys(nodes.data("a2"))) as a2:
        c16 = [await calls(a2, target, opts.calls, 16) for _ in range(opts.repeat)]
        cpu, cpu1 = [], []
        for _ in range(opts.repeat):
            cpu.append(await relay_cpu(nodes, "r1", a2, target, 2 * opts.calls, opts.concurrency))
            if opts.one_at_a_time:  # one frame per loop turn: nothing to batch
                cpu1.append(await relay_cpu(nodes, "r1", a2, target, opts.calls // 2, 1))
    return {
        "options": vars(opts),
        "relayed_c16": c16,
        "relay_cpu": cpu,
        "relay_cpu_c1": cpu1,
        "core_frame": [core_frame_us(opts.core_frames) for _ in range(opts.repeat)],
        "core_batch": [core_batch_us(opts.core_frames) for _ in range(opts.repeat)],
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repeats of what spec §11 bounds."""

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    if "rounds" in result:  # --latency
        keys = result["ratios"][0].keys()
        loads = [row[k][w] for row in result["rounds"] for k in ("direct", "relayed")
                 for w in ("load_before", "load_after")]  # fmt: skip
        return {
            **{k: med([x[k] for x in result["ratios"]]) for k in keys},
            "load_min": round(min(loads), 2),
            "load_max": round(max(loads), 2),
        }
    if "ratios" not in result:  # --cpu-only
        out = {
            "relay_us_per_frame_less_idle": med(
                [x["us_per_frame_less_idle"] for x in result["relay_cpu"]]
            ),
            "frames_per_message_in": med(
                [x["frames_per_message_in"] or 0 for x in result["relay_cpu"]]
            ),
            "writes_per_frame": med([x["writes_per_frame"] for x in result["relay_cpu"]]),
            "core_us_per_frame": med([x["us_per_frame"] for x in result["core_frame"]]),
            "core_batch_us_per_frame": med(
                [x["us_per_frame"] for x in result["core_batch"] if x] or [0.0]
            ),
        }
        if result["relay_cpu_c1"]:
            out["c1_relay_us_per_frame_less_idle"] = med(
                [x["us_per_frame_less_idle"] for x in result["relay_cpu_c1"]]
            )
        return out
    r = result["ratios"]
    return {
        "c1_p50_added_ms": med([x["c1_p50_added_ms"] for x in r]),
        "c16_calls_per_s_ratio": med([x["c16_calls_per_s_ratio"] for x in r]),
        "fanout_ratio": med([x["fanout_ratio"] for x in r]),
        "relay_us_per_frame_less_idle": med(
            [x["us_per_frame_less_idle"] for x in result["relay_cpu"]]
        ),
        "core_us_per_frame": med([x["us_per_frame"] for x in result["core_frame"]]),
    }


def main() -> None:
    """Run and save bench/results/relay.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (~1 min)")
    parser.add_argument("--calls", type=int, default=2000, help="calls at concurrency 16")
    parser.add_argument("--messages", type=int, default=1000, help="publishes per fan-out run")
    parser.add_argument("--subscribers", type=int, default=10, help="subscriptions on B")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each measurement")
    parser.add_argument("--core-frames", type=int, default=50_000)
    parser.add_argument(
        "--cpu-only",
        action="store_true",
        help="only the relayed pair and the relay's CPU per frame (no direct, fan-out, failover)",
    )
    parser.add_argument(
        "--latency",
        action="store_true",
        help="direct and relayed pairs up at once, calls (and fan-out) in alternate rounds",
    )
    parser.add_argument("--no-fanout", action="store_true", help="--latency: calls only")
    parser.add_argument(
        "--spy",
        default=None,
        metavar="DIR",
        help="--latency: py-spy profiles of the nodes during the calls at 16, into DIR",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="--cpu-only: relayed calls in flight while the relay's CPU is measured",
    )
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="--cpu-only: also the relay's CPU with one call at a time (nothing to batch)",
    )
    parser.add_argument(
        "--member-budget",
        type=int,
        default=None,
        help="the relay's per-member budget, bytes/s (pacing; default: 64 MiB/s, not binding)",
    )
    parser.add_argument("--name", default="relay", help="results file bench/results/NAME.json")
    parser.add_argument(
        "--default-budget",
        action="store_true",
        help="keep the relay's default per-member budget (256 KiB/s) instead of raising it",
    )
    args = parser.parse_args()
    if args.quick:
        args.calls, args.messages, args.repeat, args.core_frames = 200, 100, 1, 5000
    if args.default_budget:
        del FAST["HEARTHNET_MESH_RELAY_MEMBER_BYTES_PER_S"]
        del FAST["HEARTHNET_MESH_RELAY_CAPACITY_BYTES_PER_S"]
    if args.member_budget is not None:
        FAST["HEARTHNET_MESH_RELAY_MEMBER_BYTES_PER_S"] = str(args.member_budget)
    result = uvloop.run(latency(args) if args.latency else run(args))
    result["summary"] = summary(result)
    save(args.name, result)


if __name__ == "__main__":
    main()
