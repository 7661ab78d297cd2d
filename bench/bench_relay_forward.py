"""A relay's CPU per forwarded frame, forwarding alone (spec §11: ≤ 5 µs), by frames per
WebSocket message.

A relay node (``hearthnet node start --relay``) and two members played by this process:
each joins with an invite, links to the relay over ``/mesh/v1/peer`` with the real
signed hello (the newest peer-link version the code under test speaks) and attaches. A
sends B ``--frames`` route frames of ``--inner`` bytes through the relay, ``--per-write``
of them per socket write, at most ``--rate`` frames/s and ``--window`` frames ahead of
what B has received; B counts them. No end-to-end
session is needed: the relay never opens ``inner``. The relay's process CPU from /proc,
from the first frame sent until B holds the last, idle subtracted (3 s measured before),
divided by the frames forwarded: the forwarding alone, with none of the calls, seals and
acks of ``bench_relay``'s relayed calls around it.

Modes (``--modes``): ``single-K``: K route frames per write, each its own WebSocket
message (what a member before ``hearthnet-peer.v4`` sends, and anything after it that
cannot batch: ``single-1`` is one frame per write); ``batch-K``: K route frames in one
route batch per write (v4; skipped on a build without route batches). ``@R`` after a
mode sends at most R frames/s in it: ``single-1@2000`` is traffic a relay takes one frame
at a time, nothing queued behind it to batch.

Run: python -m bench.bench_relay_forward [--modes single-1@2000,single-1,single-8,batch-8,batch-32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import WSMsgType

from bench.bench_relay import FAST, ROUTE_MESSAGES_IN, cli, metric
from bench.common import proc_cpu_s, save, start_node
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore
from hearthnet.identity import load_or_create_keys
from hearthnet.membership import Membership, Source
from hearthnet.mesh.admission import Invite, redeem_invite
from hearthnet.mesh.heartbeat import pong_for
from hearthnet.mesh.links import run_handshake
from hearthnet.mesh.protocol import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    Handshake,
    decode_frame,
    encode_frame,
    link_version,
)
from hearthnet.mesh.relay_frames import Attach, Route
from hearthnet.mesh.route_header import encode_route, is_binary
from hearthnet.mesh.wsbatch import BatchWriter

BATCH_PREFIX = b"H\x01\x02\x00"  # a route batch (mesh/route_batch.py, hearthnet-peer.v4)


class Member:
    """One member played by hand: its link to the relay, and the route frames it got."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.keys = load_or_create_keys(data_dir)
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.frames = 0  # route frames received
        self.messages = 0  # route messages received
        self.attached = asyncio.Event()
        self.done = asyncio.Event()
        self.moved = asyncio.Event()  # set on each route message received
        self.want = 0

    async def link(self, http: aiohttp.ClientSession, relay_url: str, community: str) -> None:
        """Link to the relay with the real hello and attach."""
        view = Membership(community)
        view.add_all(CommunityStore(self.data_dir).load(), Source.STORE)
        self.ws = await http.ws_connect(
            relay_url + "/mesh/v1/peer", protocols=(SUBPROTOCOL,), max_msg_size=MAX_FRAME_BYTES
        )
        hello = Handshake(self.keys, view, True, now_ms(), name="m", link=link_version(SUBPROTOCOL))
        await run_handshake(self.ws, hello, now_ms)
        asyncio.get_running_loop().create_task(self.read())
        await self.ws.send_bytes(Attach(now_ms()).encode())
        await asyncio.wait_for(self.attached.wait(), 10)

    async def read(self) -> None:
        """Count route frames; answer pings so the relay keeps the link."""
        assert self.ws is not None
        while (msg := await self.ws.receive()).type == WSMsgType.BINARY:
            data: bytes = msg.data
            if data[:4] == BATCH_PREFIX or is_binary(data):
                self.messages += 1
                self.frames += _frames_in(data)
                self.moved.set()
                if self.want and self.frames >= self.want:
                    self.done.set()
                continue
            frame = decode_frame(data)
            if frame["t"] == "attached":
                self.attached.set()
            elif frame["t"] == "ping":
                pong = encode_frame("pong", **pong_for(frame, now_ms()))
                await self.ws.send_bytes(pong)


def _frames_in(data: bytes) -> int:
    """Route frames in one message: 1, or those of a route batch (walked by header)."""
    if data[:4] != BATCH_PREFIX:
        return 1
    n, at = 0, 4
    while at < len(data):
        at += 81 + int.from_bytes(data[at + 77 : at + 81], "big")
        n += 1
    return n


async def send(a: Member, b: Member, mode: str, frames: int, opts: argparse.Namespace) -> float:
    """A sends B ``frames`` route frames in ``mode``; the wall seconds until B has them."""
    spec, _, rate = mode.partition("@")
    kind, k = spec.split("-")
    per, rate_per_s = int(k), float(rate or opts.rate)
    raws = [
        encode_route(Route(b.keys.node_id, a.keys.node_id, 4, i, b"s" * opts.inner))
        for i in range(opts.next_id, opts.next_id + frames)
    ]
    opts.next_id += frames
    assert a.ws is not None
    writer = BatchWriter(a.ws)
    b.want, b.frames, b.messages = frames, 0, 0
    b.done.clear()
    start = time.monotonic()
    for i in range(0, frames, per):
        chunk = raws[i : i + per]
        if kind == "batch":
            await a.ws.send_bytes(BATCH_PREFIX + b"".join(chunk))
        else:
            await writer.send(chunk)
        lag = start + (i + per) / rate_per_s - time.monotonic()
        await asyncio.sleep(max(0.0, lag))
        # B reads in this process too: never more than --window frames ahead of it, or
        # the relay's queue to B fills and it drops B's link, as it must (spec §7.2)
        while i + per - b.frames > opts.window:
            b.moved.clear()
            await asyncio.wait_for(b.moved.wait(), 30)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(b.done.wait(), 60)
    return time.monotonic() - start


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    """The relay, both members, each mode in turn (``--repeat`` rounds)."""
    root = Path(tempfile.mkdtemp(prefix="hn-relayfwd-"))
    relay = start_node("--no-zeroconf", "--relay", "--name", "r", env=FAST, data_dir=root / "r")
    results: list[dict[str, Any]] = []
    try:
        members, community = [], ""
        for name in ("a", "b"):  # an invite each: one joins once
            invite = ("community", "invite", "--data-dir", str(root / "r"))
            token = cli(*invite, "--bootstrap", relay.url)
            community = Invite.decode(token).community
            await redeem_invite(root / name, token, name=name)
            members.append(Member(root / name))
        async with aiohttp.ClientSession() as http:
            for m in members:
                await m.link(http, relay.url, community)
            a, b = members
            await send(a, b, "single-8", 2000, opts)  # warm up
            batches = SUBPROTOCOL >= "hearthnet-peer.v4"
            for _ in range(opts.repeat):
                for mode in opts.modes.split(","):
                    if mode.startswith("batch") and not batches:
                        continue
                    c0, t0 = proc_cpu_s(relay.pid), time.monotonic()
                    await asyncio.sleep(3)
                    idle = (proc_cpu_s(relay.pid) - c0) / (time.monotonic() - t0)
                    f0, m0 = (
                        metric(relay.url, "hearthnet_relay_forwarded_frames"),
                        metric(relay.url, ROUTE_MESSAGES_IN),
                    )
                    c0 = proc_cpu_s(relay.pid)
                    wall = await send(a, b, mode, opts.frames, opts)
                    cpu = proc_cpu_s(relay.pid) - c0
                    forwarded = metric(relay.url, "hearthnet_relay_forwarded_frames") - f0
                    read = metric(relay.url, ROUTE_MESSAGES_IN) - m0
                    results.append(
                        {
                            "mode": mode,
                            "received": b.frames,
                            "forwarded": int(forwarded),
                            "frames_per_message_in": round(forwarded / read, 2) if read else None,
                            "frames_per_message_out": round(b.frames / max(1, b.messages), 2),
                            "wall_s": round(wall, 3),
                            "relay_cpu_s": round(cpu, 3),
                            "idle_cpu_per_s": round(idle, 4),
                            "us_per_frame": round(cpu / max(1, forwarded) * 1e6, 2),
                            "us_per_frame_less_idle": round(
                                max(0.0, cpu - idle * wall) / max(1, forwarded) * 1e6, 2
                            ),
                        }
                    )
                    print(results[-1], flush=True)
    finally:
        relay.stop()
    return {"options": vars(opts), "subprotocol": SUBPROTOCOL, "runs": results}


def main() -> None:
    """Run and save bench/results/NAME.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="single-1@2000,single-1,single-8,batch-8,batch-32")
    parser.add_argument("--frames", type=int, default=20_000, help="route frames per mode")
    parser.add_argument("--inner", type=int, default=300, help="bytes of each frame's inner")
    parser.add_argument("--rate", type=float, default=20_000, help="frames/s sent at most")
    parser.add_argument("--window", type=int, default=4000, help="frames ahead of B, at most")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--name", default="relay_forward")
    args = parser.parse_args()
    args.next_id = 1
    result = uvloop.run(run(args))
    save(args.name, result)


if __name__ == "__main__":
    main()
