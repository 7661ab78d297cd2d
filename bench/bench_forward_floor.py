"""The floor under a relay's CPU per forwarded frame: the least any Python event loop
spends to pass one frame from one TCP connection to another, by frames per wake-up.

A forwarder process (this file with ``--serve``) does nothing but forwarding: uvloop, a
raw ``asyncio.Protocol`` whose ``data_received`` writes the bytes to the other connection,
no framing, no parsing, no WebSocket, no checks. This process plays both ends: A writes
K frames of ``--inner`` bytes per socket write (mode ``K``, or ``K@R``: at most R frames/s),
B reads until it holds every byte. The forwarder's process CPU from /proc, from the first
write until B holds the last byte, idle subtracted (2 s measured before), divided by the
frames: what the kernel's ``read``, ``write`` and ``epoll`` and the event loop's wake-up
cost per frame, the part of ``bench_relay_forward``'s figure that no relay code can
remove (docs/benchmarks-log.md, "The floor under a relay's CPU per frame").

``--socat`` measures socat (Debian's package; C, a blocking select loop) forwarding the
same way: the kernel's and a C loop's part alone.

Run: python -m bench.bench_forward_floor [--modes 1@2000,1,8,32] [--frames 20000] [--socat]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from typing import Any, cast

import uvloop

from bench.common import proc_cpu_s, save, stop_process


class _Pipe(asyncio.Protocol):
    """One end of the forwarder: what it reads goes to the other end as it came."""

    def __init__(self, ends: list[_Pipe]) -> None:
        self.ends = ends
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.ends.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.ends:
            self.ends.remove(self)

    def data_received(self, data: bytes) -> None:
        ends = self.ends
        if len(ends) == 2:
            other = ends[1] if ends[0] is self else ends[0]
            assert other.transport is not None
            other.transport.write(data)


async def _serve(port_out: int) -> None:
    loop = asyncio.get_running_loop()
    ends: list[_Pipe] = []
    server = await loop.create_server(lambda: _Pipe(ends), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    await asyncio.sleep(600)  # bounded: the bench stops it by PID long before
    server.close()


def _mode(text: str) -> tuple[int, float | None]:
    per, _, rate = text.partition("@")
    return int(per), (float(rate) if rate else None)


def _python_pair(port: int) -> tuple[socket.socket, socket.socket]:
    """A and B, both connected to the Python forwarder (A first)."""
    a = socket.create_connection(("127.0.0.1", port))
    time.sleep(0.05)
    b = socket.create_connection(("127.0.0.1", port))
    time.sleep(0.2)
    return a, b


def _socat_pair() -> tuple[socket.socket, socket.socket, subprocess.Popen[Any]]:
    """A connected to a socat that connects on to B (this process listens for B)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port_b = listener.getsockname()[1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port_a = probe.getsockname()[1]
    proc = subprocess.Popen(
        ["socat", f"TCP-LISTEN:{port_a},bind=127.0.0.1,reuseaddr", f"TCP:127.0.0.1:{port_b}"]
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            a = socket.create_connection(("127.0.0.1", port_a))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                stop_process(proc)
                raise
            time.sleep(0.05)
    listener.settimeout(10)
    b, _ = listener.accept()
    listener.close()
    time.sleep(0.2)
    return a, b, proc


def _run_mode(
    a: socket.socket, b: socket.socket, pid: int, per_write: int, rate: float | None, opts: Any
) -> float:
    """Forwarder CPU µs per frame for one mode (one pair of connections)."""
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    idle_0 = proc_cpu_s(pid)
    time.sleep(2.0)
    idle_per_s = (proc_cpu_s(pid) - idle_0) / 2.0
    chunk = b"x" * (opts.inner * per_write)
    writes = opts.frames // per_write
    total = len(chunk) * writes
    gap = per_write / rate if rate else 0.0  # rate: frames/s, as in bench_relay_forward
    got = 0
    b.setblocking(False)
    cpu_0 = proc_cpu_s(pid)
    t0 = time.perf_counter()
    deadline = t0 + opts.max_s
    next_at = t0
    for _ in range(writes):
        if gap:
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            next_at += gap
        a.sendall(chunk)
        try:
            while True:
                data = b.recv(1 << 20)
                if not data:
                    break
                got += len(data)
        except BlockingIOError:
            pass
        if time.perf_counter() > deadline:
            raise SystemExit("forwarding took longer than --max-s")
    b.setblocking(True)
    b.settimeout(10)
    while got < total:
        got += len(b.recv(1 << 20))
    wall = time.perf_counter() - t0
    cpu = proc_cpu_s(pid) - cpu_0 - idle_per_s * wall
    a.close()
    b.close()
    us: float = cpu / (writes * per_write) * 1e6
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--modes", default="1@2000,1,8,32", help="frames per write[@frames/s]")
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--inner", type=int, default=300, help="bytes a frame")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--socat", action="store_true", help="also socat (C, one process) as the forwarder"
    )
    parser.add_argument("--max-s", type=float, default=60.0, help="bound on one mode's run")
    opts = parser.parse_args()
    if opts.serve:
        uvloop.run(_serve(0))
        return
    rows: dict[str, list[float]] = {}
    for _ in range(opts.repeat):
        if opts.socat:
            for mode in opts.modes.split(","):
                per_write, rate = _mode(mode)
                a, b, socat = _socat_pair()
                try:
                    us = _run_mode(a, b, socat.pid, per_write, rate, opts)
                finally:
                    stop_process(socat)
                rows.setdefault(f"socat {mode}", []).append(round(us, 2))
                print(f"socat {mode}: {us:.2f} µs a frame", flush=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_forward_floor", "--serve"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            for mode in opts.modes.split(","):
                per_write, rate = _mode(mode)
                a, b = _python_pair(port)
                us = _run_mode(a, b, proc.pid, per_write, rate, opts)
                rows.setdefault(mode, []).append(round(us, 2))
                print(f"{mode}: {us:.2f} µs a frame", flush=True)
        finally:
            stop_process(proc)
    save("forward_floor", {"modes": rows, "frames": opts.frames, "inner": opts.inner})


if __name__ == "__main__":
    main()
