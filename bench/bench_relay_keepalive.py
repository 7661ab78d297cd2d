"""Relay keepalive benchmark (spec §8 failover, §11: traffic resumes ≤ 5 s after a relay
dies): how long a relay may stay silent before its members leave it
(``mesh.relay_silence_s``), measured on this machine as it is loaded.

Two relays (R1 founds the community, R2 joins) and, for each silence setting, two members
that nobody can dial, attached to both relays (``--relay-url`` twice) and relayed to each
other. Then:

1. **Idle**: for ``--idle-s`` seconds nothing but keepalives and the mesh's own traffic;
   each member's ``relays_silent`` (a relay called silent although it runs: a needless
   re-attach) and ``keepalive_stalls`` (ticks of its own loop that came late, not counted
   as the relay's silence) from ``/status``.
2. **Silent death**: the relay most pairs use is stopped with SIGSTOP (its connections stay
   open: no reset tells the members), and per member the time until it called that relay
   silent; per pair whose path went through it, the time until a pinned ``echo@1.0`` call
   (2 s deadline, retried) goes through again.

Every node is a real process on loopback, stopped by PID; every loop is bounded.

Run: python -m bench.bench_relay_keepalive [--silence 2.5 3 4] [--idle-s 120]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_relay import FAST, UNDIALLABLE, cli
from bench.common import NodeUnderTest, save, start_node
from hearthnet.client import Client
from hearthnet.errors import HearthNetError
from hearthnet.identity import load_or_create_keys

RESUME_LIMIT_S = 20.0  # a call retried this long at most after the stop
SETTLE_S = 90.0  # members attached to both relays and relayed to each other within this


def status(node: NodeUnderTest) -> dict[str, Any]:
    """``relaying.paths`` of a node's public ``/status``."""
    with urllib.request.urlopen(node.url + "/status", timeout=10) as resp:
        paths: dict[str, Any] = json.loads(resp.read())["relaying"].get("paths", {})
        return paths


class Lab:
    """The relays and members of one run, each stopped by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: dict[str, NodeUnderTest] = {}

    def start(self, name: str, *extra: str, env: dict[str, str] | None = None) -> NodeUnderTest:
        """Start ``name`` (joining R1's community unless it is R1)."""
        if name != "r1":
            invite = cli(
                "community", "invite", "--data-dir", str(self.root / "r1"),
                "--bootstrap", self.nodes["r1"].url,
            )  # fmt: skip
            extra = ("--join", invite, *extra)
        node = start_node(
            "--no-zeroconf", "--name", name, *extra,
            env={**FAST, **(env or {})}, data_dir=self.root / name,
        )  # fmt: skip
        self.nodes[name] = node
        return node

    def node_id(self, name: str) -> str:
        """The NodeID of ``name``."""
        return load_or_create_keys(self.root / name).node_id

    def stop_all(self) -> None:
        """Every node, continued first if stopped."""
        for node in self.nodes.values():
            with contextlib.suppress(ProcessLookupError):
                node.proc.send_signal(signal.SIGCONT)
                node.proc.terminate()
        for node in self.nodes.values():
            node.stop()
            if node.proc.stdout:
                node.proc.stdout.close()


async def peer_path(lab: Lab, a: str, b: str) -> tuple[str, str | None] | None:
    """``(path, via)`` of ``a``'s link to ``b`` (``GET /mesh/v1/peers``), None unlinked."""
    async with Client(lab.nodes[a].url, keys=load_or_create_keys(lab.root / a)) as client:
        peers = (await client.request_json("GET", "/mesh/v1/peers"))["peers"]
    for p in peers:
        if p["linked"] and p["node"] == lab.node_id(b):
            return (p["path"], p["via"])
    return None


async def settled(
    lab: Lab, pairs: list[tuple[str, str]], both: bool = True
) -> dict[str, str | None]:
    """Wait until every member is relayed to its partner (and, with ``both``, attached to
    both relays); ``{member: relay its path to the partner goes through}``."""
    deadline = time.monotonic() + SETTLE_S
    relays = sorted(lab.node_id(r) for r in ("r1", "r2"))
    while True:
        via: dict[str, str | None] = {}
        seen: dict[str, Any] = {}
        for a, b in [*pairs, *((b, a) for a, b in pairs)]:
            path = await peer_path(lab, a, b)
            attached = (await asyncio.to_thread(status, lab.nodes[a])).get("relays")
            seen[a] = (path, attached)
            ok = path and path[0] == "relayed" and (attached == relays or not both)
            via[a] = path[1] if ok and path else None
        if all(via.values()):
            return via
        if time.monotonic() > deadline:
            raise RuntimeError(f"members did not settle: {seen}")
        await asyncio.sleep(1)


async def detected(lab: Lab, member: str, before: int, since: float) -> float | None:
    """Seconds from ``since`` until ``member`` counted one more silent relay."""
    async with Client(lab.nodes[member].url, keys=load_or_create_keys(lab.root / member)) as client:
        while time.monotonic() - since < RESUME_LIMIT_S:
            with contextlib.suppress(HearthNetError, OSError, TimeoutError):
                now = await asyncio.wait_for(client.request_json("GET", "/status"), 2)
                if now["relaying"]["paths"].get("relays_silent", 0) > before:
                    return time.monotonic() - since
            await asyncio.sleep(0.1)
    return None


async def resumed(lab: Lab, a: str, b: str, since: float) -> float | None:
    """Seconds from ``since`` until a call from ``a`` pinned to ``b`` answers."""
    async with Client(lab.nodes[a].url, keys=load_or_create_keys(lab.root / a)) as client:
        while time.monotonic() - since < RESUME_LIMIT_S:
            with contextlib.suppress(HearthNetError, TimeoutError, OSError):
                await asyncio.wait_for(
                    client.call_with_meta(
                        "echo@1.0", {"x": 1}, target=lab.node_id(b), deadline_ms=2000
                    ),
                    3,
                )
                return time.monotonic() - since
    return None


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Idle, then a silent death; the result."""
    lab = Lab(Path(tempfile.mkdtemp(prefix="hn-keepalive-")))
    result: dict[str, Any] = {"options": vars(opts), "load_before": os.getloadavg()}
    try:
        lab.start("r1", "--relay")
        lab.start("r2", "--relay")
        relays = ("--relay-url", lab.nodes["r1"].url, "--relay-url", lab.nodes["r2"].url)
        pairs: list[tuple[str, str]] = []
        setting_of: dict[str, float] = {}
        for silence in opts.silence:
            env = {
                # the default heartbeats (three of 5 s), so that the keepalive, not a link's
                # missed pongs, notices the silent relay, as it would outside this bench
                "HEARTHNET_MESH_HEARTBEAT_S": "5",
                "HEARTHNET_MESH_RELAY_SILENCE_S": str(silence),
                "HEARTHNET_MESH_RELAY_KEEPALIVE_S": str(opts.keepalive),
            }
            names = (f"a{silence}", f"b{silence}")
            for name in names:
                lab.start(name, *relays, "--advertise-url", UNDIALLABLE, env=env)
                setting_of[name] = silence
            pairs.append(names)
        via = await settled(lab, pairs)
        before = {m: (await asyncio.to_thread(status, lab.nodes[m])) for m in setting_of}
        await asyncio.sleep(opts.idle_s)
        after = {m: (await asyncio.to_thread(status, lab.nodes[m])) for m in setting_of}
        result["load_idle"] = os.getloadavg()
        result["idle"] = {
            m: {
                "silence_s": setting_of[m],
                "relays_silent": after[m].get("relays_silent", 0)
                - before[m].get("relays_silent", 0),
                "keepalive_stalls": after[m].get("keepalive_stalls", 0)
                - before[m].get("keepalive_stalls", 0),
            }
            for m in setting_of
        }
        # 2. the relay most paths go through stops without a word
        via = await settled(lab, pairs, both=False)
        result["attached"] = {
            m: (await asyncio.to_thread(status, lab.nodes[m])).get("relays") for m in setting_of
        }
        ids = {lab.node_id(r): r for r in ("r1", "r2")}
        used = max(ids, key=lambda r: sum(v == r for v in via.values()))
        counts = {m: (await asyncio.to_thread(status, lab.nodes[m])).get("relays_silent", 0)
                  for m in setting_of}  # fmt: skip
        stopped_at = time.monotonic()
        lab.nodes[ids[used]].proc.send_signal(signal.SIGSTOP)
        # per pair, a call from the side whose own path went through the stopped relay
        callers = [
            (a, b) if via[a] == used else (b, a) for a, b in pairs if used in (via[a], via[b])
        ]
        found = await asyncio.gather(
            *(detected(lab, m, counts[m], stopped_at) for m in setting_of),
            *(resumed(lab, a, b, stopped_at) for a, b in callers),
        )
        detections, calls = found[: len(setting_of)], found[len(setting_of) :]
        result["stopped"] = ids[used]
        result["detected_s"] = dict(zip(setting_of, detections, strict=True))
        result["resumed_s"] = dict(zip([a for a, _ in callers], calls, strict=True))
        result["load_after"] = os.getloadavg()
    finally:
        lab.stop_all()
    return result


def main() -> None:
    """Parse flags, run, save and print the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silence", type=float, nargs="+", default=[2.5, 3.0, 4.0])
    parser.add_argument("--keepalive", type=float, default=1.0)
    parser.add_argument("--idle-s", type=float, default=120.0)
    opts = parser.parse_args()
    result = asyncio.run(run(opts))
    path = save("relay_keepalive", result)
    print(json.dumps(result, indent=2))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
