"""A peer link's read path alone (spec §11: a relay forwards a frame for ≤ 5 µs of CPU).

This process listens on loopback; a client process it starts sends ``--frames`` binary
route-tagged frames of ``--size`` bytes (masked, as a member's are), ``--burst`` frames
per write, at ``--rate`` frames/s. This process's CPU time from the first frame read to
the last, divided by the frames, is the read path's cost per frame, in one of these
modes (each run ``--repeat`` times, alternated):

* ``floor``: an asyncio protocol that only counts the bytes it is given: what the event
  loop's reads and wake-ups cost, the least any Python reader pays;
* ``split``: the same protocol splitting each read into frames
  (:class:`~hearthnet.mesh.wsframes.FrameSplitter`) and counting them;
* ``receive``: an aiohttp WebSocket and a :class:`~hearthnet.mesh.links.PeerLink` reading
  with ``receive()``, one message per frame (the link's reads before batching);
* ``batched``: the same with :func:`~hearthnet.mesh.linkread.install`: every frame of a
  read handed to the link in one call.

The link's ``on_binary`` only counts (the relay's own per-frame work is ``core_frame`` in
``bench_relay.py``). Reads per frame come from ``/proc/self/io``.

Run: python -m bench.bench_linkread [--frames 200000] [--modes floor,split,receive,batched]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web
from aiohttp._websocket.helpers import websocket_mask

from hearthnet.mesh.linkread import install
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.protocol import MAX_FRAME_BYTES, PeerInfo
from hearthnet.mesh.route_header import TAG_BYTE
from hearthnet.mesh.wsbatch import encode_frames
from hearthnet.mesh.wsframes import FrameSplitter

MODES = ("floor", "split", "receive", "batched")
CLIENT_TIMEOUT_S = 120.0


def cpu_s() -> float:
    """This process's CPU time (user + system), seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_calls() -> int:
    """This process's read system calls so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    return 0


class Meter:
    """Counts frames; takes CPU and reads at the first and the last."""

    def __init__(self, frames: int) -> None:
        self.frames = frames
        self.seen = 0
        self.start = (0.0, 0)
        self.done = asyncio.get_running_loop().create_future()

    def add(self, n: int) -> None:
        """``n`` more frames read."""
        if self.seen == 0:
            self.start = (cpu_s(), read_calls())
        self.seen += n
        if self.seen >= self.frames and not self.done.done():
            self.done.set_result((cpu_s() - self.start[0], read_calls() - self.start[1]))


class Counting(asyncio.Protocol):
    """``floor``: bytes counted, frames inferred from the fixed frame size."""

    def __init__(self, meter: Meter, wire_size: int, split: bool) -> None:
        self.meter = meter
        self.wire_size = wire_size
        self.bytes = 0
        self.splitter = FrameSplitter(MAX_FRAME_BYTES, websocket_mask) if split else None

    def data_received(self, data: bytes) -> None:
        """One read."""
        if self.splitter is not None:
            self.meter.add(len(self.splitter.feed(data)))
            return
        before = self.bytes // self.wire_size
        self.bytes += len(data)
        self.meter.add(self.bytes // self.wire_size - before)


def client(port: int, frames: int, size: int, burst: int, rate: float, upgrade: bool) -> None:
    """The sending side (a separate process): upgrade if asked, then the frames, paced."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if upgrade:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head[:80]
    payload = TAG_BYTE + bytes(size - 1)
    chunk = encode_frames([payload] * burst, masked=True)
    interval = burst / rate
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    due = time.monotonic()
    for _ in range(frames // burst):
        sock.sendall(chunk)
        due += interval
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if time.monotonic() > deadline:
            break
    time.sleep(1.0)
    sock.close()


async def measure(mode: str, opts: argparse.Namespace) -> dict[str, Any]:
    """One run of ``mode``: CPU per frame and reads per frame on this side."""
    meter = Meter(opts.frames - opts.frames % opts.burst)
    loop = asyncio.get_running_loop()
    wire_size = len(encode_frames([bytes(opts.size)], masked=True))
    server: Any
    runner: web.AppRunner | None = None
    if mode in ("floor", "split"):
        server = await loop.create_server(
            lambda: Counting(meter, wire_size, mode == "split"), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
    else:

        async def handler(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, compress=False)
            await ws.prepare(request)
            if mode == "batched":
                assert install(ws, MAX_FRAME_BYTES) is not None
            link = PeerLink(
                PeerInfo("ed25519:bench", "bench", None, "0"),
                ws,
                outbound=False,
                on_frame=lambda _link, _frame: None,
                on_down=lambda _link, _reason: None,
                on_binary=lambda _link, _data: meter.add(1),
            )
            await link.run()
            return ws

        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = None
        port = runner.addresses[0][1]
    args = [str(port), str(opts.frames), str(opts.size), str(opts.burst), str(opts.rate)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.bench_linkread", "--client", *args, mode
    )
    try:
        cpu, reads = await asyncio.wait_for(meter.done, CLIENT_TIMEOUT_S)
    finally:
        await asyncio.wait_for(proc.wait(), CLIENT_TIMEOUT_S)
        if runner is not None:
            await runner.cleanup()
        else:
            server.close()
    return {
        "mode": mode,
        "frames": meter.seen,
        "us_per_frame": round(cpu / meter.seen * 1e6, 3),
        "reads_per_frame": round(reads / meter.seen, 4),
    }


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Every mode ``--repeat`` times, alternated; medians."""
    runs: list[dict[str, Any]] = []
    for _ in range(opts.repeat):
        for mode in opts.modes.split(","):
            runs.append(await measure(mode, opts))
            print(json.dumps(runs[-1]), flush=True)
    medians = {
        mode: statistics.median(r["us_per_frame"] for r in runs if r["mode"] == mode)
        for mode in opts.modes.split(",")
    }
    return {"load_average": os.getloadavg(), "runs": runs, "median_us_per_frame": medians}


def main() -> None:
    """Parse options; run the client side or the measurement."""
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, frames, size, burst, rate, mode = sys.argv[2:8]
        client(int(port), int(frames), int(size), int(burst), float(rate), mode not in MODES[:2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=300, help="bytes per frame's payload")
    parser.add_argument("--burst", type=int, default=6, help="frames per client write")
    parser.add_argument("--rate", type=float, default=40_000, help="frames/s sent")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--name", default="linkread", help="results file bench/results/NAME.json")
    opts = parser.parse_args()
    result = uvloop.run(run(opts))
    out = Path(__file__).parent / "results" / f"{opts.name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["median_us_per_frame"]))


if __name__ == "__main__":
    main()
